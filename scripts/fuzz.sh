#!/usr/bin/env bash
# Builds tandem's libFuzzer harnesses (TANDEM_FUZZ, clang, ASan + UBSan) and runs each for
# SECONDS_PER_HARNESS seconds (default 60) over its seeds in tests/fuzz/corpus/<harness>/,
# one harness after another. Prints, per harness, the executions, executions per second,
# crashes and corpus size; exits nonzero when any harness found a crash, a leak, undefined
# behaviour, a timeout or an out-of-memory input, keeping that input under
# BUILD_DIR/fuzz-artifacts/. New inputs the fuzzer finds go to BUILD_DIR/fuzz-corpus/, never
# into the committed seeds.
#   scripts/fuzz.sh [SECONDS_PER_HARNESS] [BUILD_DIR]       (BUILD_DIR: build-fuzz)
#   TANDEM_FUZZ_ONLY=tokens scripts/fuzz.sh 600              one harness
#   TANDEM_FUZZ_JOBS=2 scripts/fuzz.sh 600                   two fuzzing processes per harness
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-60}
build=${2:-$root/build-fuzz}
jobs=${TANDEM_FUZZ_JOBS:-1}
[[ "$build" = /* ]] || build=$PWD/$build

"$root/scripts/install-deps.sh" fuzz
# The compilers are chosen when the folder is first configured (changing them later would
# make CMake start the folder over).
compilers=()
if [ ! -f "$build/CMakeCache.txt" ]; then
  compilers=(-DCMAKE_C_COMPILER="${TANDEM_FUZZ_CC:-clang-14}"
             -DCMAKE_CXX_COMPILER="${TANDEM_FUZZ_CXX:-clang++-14}")
fi
cmake -S "$root" -B "$build" "${compilers[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_FUZZ=ON \
  -DTANDEM_CUDA=OFF -DTANDEM_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzzers

artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
# UB is fatal (-fno-sanitize-recover) and shows its stack; allocations beyond the RSS limit
# are reported as failures, not swapped through.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=0}
# The harnesses write every input to a file: in memory (tmpfs) that is 2-3 times faster.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi

failed=0
printf '%-18s %12s %9s %8s %8s\n' harness executions exec/s crashes corpus
for exe in "$build"/tests/fuzz/fuzz_*; do
  [ -x "$exe" ] || continue
  name=$(basename "$exe")
  name=${name#fuzz_}
  if [ -n "${TANDEM_FUZZ_ONLY:-}" ] && [ "$name" != "$TANDEM_FUZZ_ONLY" ]; then continue; fi
  seeds=$root/tests/fuzz/corpus/$name
  work=$build/fuzz-corpus/$name
  log=$build/fuzz-$name.log
  mkdir -p "$seeds" "$work"
  rm -f "$artifacts/$name"-*
  rc=0
  if [ "$jobs" -gt 1 ]; then
    # Several processes share the work corpus; each writes its own fuzz-N.log in $build.
    (cd "$build" && "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$name-" -jobs="$jobs" \
      -workers="$jobs" "$work" "$seeds" >"$log" 2>&1) || rc=$?
    cat "$build"/fuzz-[0-9]*.log >>"$log" 2>/dev/null || true
    rm -f "$build"/fuzz-[0-9]*.log
  else
    "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/$name-" "$work" "$seeds" >"$log" 2>&1 || rc=$?
  fi
  execs=$(awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}' "$log")
  rate=$(awk '/stat::average_exec_per_sec/ {s += $2} END {print s + 0}' "$log")
  crashes=$(find "$artifacts" -name "$name-*" -type f | wc -l)
  corpus=$(find "$work" "$seeds" -type f | wc -l)
  printf '%-18s %12s %9s %8s %8s\n' "$name" "$execs" "$rate" "$crashes" "$corpus"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    echo "fuzz: $name failed (exit $rc); log $log, inputs:" >&2
    find "$artifacts" -name "$name-*" -type f >&2
    grep -m1 -E "ERROR: |runtime error|deadly signal|Timeout" "$log" >&2 || true
  fi
done
exit $failed
