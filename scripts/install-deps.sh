#!/usr/bin/env bash
# Installs what tandem needs to build and test on Debian/Ubuntu. Idempotent:
# packages already present are left alone and apt is only asked when one is missing.
#   scripts/install-deps.sh        the build and the test suite
#   scripts/install-deps.sh fuzz   also clang and its runtime libraries (libFuzzer and the
#                                  sanitizers' clang runtimes) for scripts/fuzz.sh
set -euo pipefail

# chromium: headless, for the test that looks at a `tandem report` page (Debian's package;
# the test skips where it is missing).
pkgs=(build-essential cmake pkg-config libopenblas-dev libopenmpi-dev openmpi-bin
      nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev googletest python3
      libpcre2-dev libsentencepiece-dev libutf8proc-dev chromium
      python3-dev python3-pybind11 python3-numpy python3-pytest)
for group in "$@"; do
  case "$group" in
    # libclang-rt-14-dev holds libclang_rt.fuzzer-x86_64.a and the ASan/UBSan runtimes;
    # clang-14 only recommends it, and apt runs below without recommends.
    fuzz) pkgs+=(clang-14 libclang-rt-14-dev) ;;
    *) echo "install-deps: unknown group '$group' (known: fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
