#!/usr/bin/env bash
# The decoding check for a GPU machine, in one command: builds tandem with CUDA (sm_90),
# writes the greedy references of the Hugging Face fixtures with transformers
# (tools/make_generate_fixtures.py), runs the GPU tests (all of them, so the decode
# kernels' routing of small products is checked against the training tests too), times
# the decode kernels against the copy bandwidth (DecodeBench), and runs
# bench/decode_gpu.sh.
#
#   scripts/decode-check.sh OUTDIR
#
# Knobs: DECODE_BUILD=0 (use build-gpu as it is), DECODE_TARGETS (what to build),
# DECODE_TEST_FILTER (a gtest filter for the GPU tests), DECODE_TESTS=0, DECODE_FIXTURES=0,
# DECODE_KERNEL_BENCH=0, DECODE_BENCH=0; bench/decode_gpu.sh's BENCH_* pass through.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
build=${TANDEM_BUILD:-$root/build-gpu}
status=0
step() { echo "== decode-check: $1 ($(date +%T))"; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH=/usr/local/cuda/bin:$PATH

if [[ ${DECODE_BUILD:-1} == 1 ]]; then
  step build
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/build.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" --target ${DECODE_TARGETS:-tandem tandem_gpu_tests tandem_decode_bench} \
      >>"$out/build.log" 2>&1 || {
    tail -30 "$out/build.log"
    exit 1
  }
fi
if [[ ${DECODE_FIXTURES:-1} == 1 ]]; then
  step "generate references (transformers)"
  mkdir -p "$out/fixtures"
  python3 "$root/tools/make_generate_fixtures.py" --fixtures "$root/tests/fixtures/hf" \
    --out "$out/fixtures" 2>&1 | tee "$out/fixtures.log" || status=1
  cp "$out"/fixtures/*.generate.json "$root/tests/fixtures/hf/" 2>/dev/null
fi
if [[ ${DECODE_TESTS:-1} == 1 ]]; then
  step "GPU tests"
  "$build/tests/tandem_gpu_tests" ${DECODE_TEST_FILTER:+--gtest_filter=$DECODE_TEST_FILTER} \
    >"$out/gpu_tests.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|greedy tokens compared" "$out/gpu_tests.log"
fi
if [[ ${DECODE_KERNEL_BENCH:-1} == 1 ]]; then
  step "decode kernels against the copy bandwidth"
  TANDEM_GPU_BENCH=1 "$build/tests/tandem_gpu_tests" --gtest_filter="${DECODE_KERNEL_FILTER:-DecodeBench.*}" \
    >"$out/kernel_bench.log" 2>&1 || status=1
  grep -vE "^\[ (RUN|      OK) " "$out/kernel_bench.log" | grep -v "^$" | head -60
fi
if [[ ${DECODE_BENCH:-1} == 1 ]]; then
  step "bench/decode_gpu.sh"
  "$root/bench/decode_gpu.sh" "$build" "$out/bench" || status=1
fi
step "done (status $status)"
exit $status
