#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the whole test suite. CI runs exactly this.
# Steps: the Release build and its ctest suite; the Python module's pytest suite; the
# installed package and examples/ (C++ and Python); the
# whole CPU suite again under AddressSanitizer + UndefinedBehaviorSanitizer; the CPU
# streams' stress tests under ThreadSanitizer; a short run of every fuzz harness. Each
# step's time is printed at the end. TANDEM_FUZZ_SECONDS sets the fuzzing time per harness
# (default 20; 0 skips the step).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TANDEM_BUILD:-$root/build}
jobs=$(nproc)

timings=()
step_start=0
step() {
  step_end
  echo "== test.sh: $1"
  step_name=$1
  step_start=$(date +%s)
}
step_end() {
  if [ "$step_start" -ne 0 ]; then timings+=("$(printf '%6d s  %s' $(($(date +%s) - step_start)) "$step_name")"); fi
  step_start=0
}
start=$(date +%s)

step "install dependencies"
"$root/scripts/install-deps.sh"
step "build (Release)"
"$root/scripts/build.sh"
step "ctest (Release)"
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 900

# The Python module against the build tree (tests/python; Debian's interpreter and pytest).
step "pytest (Python API)"
TANDEM_BUILD="$build" /usr/bin/python3 -m pytest "$root/tests/python" -q -p no:cacheprovider

# The library as a package: install the build into a temporary prefix, then configure,
# build and run examples/ against it as another project would (find_package(tandem)).
step "package and examples/"
package=$(mktemp -d)
trap 'rm -rf "$package"' EXIT
cmake --install "$build" --prefix "$package/prefix" >/dev/null
cmake -S "$root/examples" -B "$package/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$package/prefix" >/dev/null
cmake --build "$package/build" -j"$jobs"
(cd "$package/build" && OMP_NUM_THREADS=1 ./train_tiny)
# The installed Python package, as the README says to use it.
OMP_NUM_THREADS=1 PYTHONPATH="$package/prefix/lib/python3/dist-packages" \
  /usr/bin/python3 "$root/examples/python/train_and_generate.py"

# The whole CPU suite, distributed tests included, under AddressSanitizer and
# UndefinedBehaviorSanitizer (a separate, CPU-only build; UB is fatal). Leaks fail too,
# except those of Open MPI, hwloc and OpenBLAS themselves (tests/lsan.supp; their stacks
# are complete only with the slow unwinder, fast_unwind_on_malloc=0).
asan=${TANDEM_BUILD_ASAN:-$root/build-asan}
# -O1 and line tables only (-g1): half the compile time of -O2 -g, and still whole stacks
# with file and line (the sanitizers' own recommendation is -O1).
step "build (ASan + UBSan)"
cmake -S "$root" -B "$asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTANDEM_SANITIZE=address,undefined \
  -DTANDEM_CUDA=OFF >/dev/null
cmake --build "$asan" -j"$jobs"
step "ctest (ASan + UBSan)"
asan_env=(ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:strict_string_checks=1"
  LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
# [Tracer crash] (tools/lsan_tracer_crash.py) LeakSanitizer's own tracer can crash before it
# looks for leaks; tests that failed by that alone, and nothing else, run once more.
if ! env "${asan_env[@]}" ctest --test-dir "$asan" --output-on-failure -j"$jobs" --timeout 900; then
  /usr/bin/python3 "$root/tools/lsan_tracer_crash.py" "$asan"
  echo "== test.sh: running the test(s) that LeakSanitizer's tracer crash failed once more"
  env "${asan_env[@]}" ctest --test-dir "$asan" --output-on-failure --rerun-failed --timeout 900
fi

# The CPU streams' stress tests again under ThreadSanitizer (a separate, CPU-only build of
# the two layers they test, tandem_stress_tests).
tsan=${TANDEM_BUILD_TSAN:-$root/build-tsan}
step "build (TSan)"
cmake -S "$root" -B "$tsan" -DCMAKE_BUILD_TYPE=Debug -DTANDEM_SANITIZE=thread -DTANDEM_CUDA=OFF \
  >/dev/null
cmake --build "$tsan" -j"$jobs" --target tandem_stress_tests
step "stress tests (TSan)"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$tsan/tests/tandem_stress_tests" \
  --gtest_filter='CpuDevice.*:Arena.*'

# Every parser's fuzz harness for a short while (scripts/fuzz.sh; clang, libFuzzer).
fuzz_seconds=${TANDEM_FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" -gt 0 ]; then
  step "fuzz (${fuzz_seconds} s per harness)"
  "$root/scripts/fuzz.sh" "$fuzz_seconds" "${TANDEM_BUILD_FUZZ:-$root/build-fuzz}"
fi
step_end

echo "test.sh step times:"
printf '%s\n' "${timings[@]}"
echo "test suite: $(($(date +%s) - start)) s"
