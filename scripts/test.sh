#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the whole test suite. CI runs exactly this.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TANDEM_BUILD:-$root/build}
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
start=$(date +%s)
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --timeout 900

# The library as a package: install the build into a temporary prefix, then configure,
# build and run examples/ against it as another project would (find_package(tandem)).
package=$(mktemp -d)
trap 'rm -rf "$package"' EXIT
cmake --install "$build" --prefix "$package/prefix" >/dev/null
cmake -S "$root/examples" -B "$package/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$package/prefix" >/dev/null
cmake --build "$package/build" -j"$(nproc)"
(cd "$package/build" && OMP_NUM_THREADS=1 ./train_tiny)

# The CPU streams' stress tests again under ThreadSanitizer (a separate, CPU-only build).
tsan=${TANDEM_BUILD_TSAN:-$root/build-tsan}
cmake -S "$root" -B "$tsan" -DCMAKE_BUILD_TYPE=Debug -DTANDEM_SANITIZE=thread -DTANDEM_CUDA=OFF \
  >/dev/null
cmake --build "$tsan" -j"$(nproc)" --target tandem_tests
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$tsan/tests/tandem_tests" \
  --gtest_filter='CpuDevice.*:Arena.*'
echo "test suite: $(( $(date +%s) - start )) s"
