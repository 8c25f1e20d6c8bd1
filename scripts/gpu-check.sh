#!/usr/bin/env bash
# The GPU check: one command for a GPU machine. Builds tandem with the CUDA backend into
# build-gpu (Release, sm_90), runs the GPU tests (tests/gpu) with a log and a JUnit XML
# report, runs the NCCL tests across all GPUs under mpirun when there are several, runs
# compute-sanitizer's memcheck and racecheck on a subset of the tests, then prints
# a summary table and exits nonzero if any step failed.
#
#   scripts/gpu-check.sh OUTDIR
#
# OUTDIR receives: build.log, gpu_tests.log, gpu_tests.xml, nccl_mpi.log (2+ GPUs only),
# memcheck.log, racecheck.log, system.txt and summary.txt. Environment knobs:
# TANDEM_BUILD (build folder, default build-gpu), TANDEM_GPU_STEP_TIMEOUT (seconds per
# step, default 1800), and the sanitizer test filters TANDEM_MEMCHECK_FILTER and
# TANDEM_RACECHECK_FILTER (see below).
#
# Expects the GPU machine's preinstalled toolchain (Ubuntu 24.04, g++ 13, CMake 4, CUDA
# 13.0 with compute-sanitizer, NCCL 2.28, OpenMPI, OpenBLAS, nlohmann-json, CLI11, fmt,
# GoogleTest); needs no network.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
build=${TANDEM_BUILD:-$root/build-gpu}
step_timeout=${TANDEM_GPU_STEP_TIMEOUT:-1800}
jobs=$(nproc)

# NVLink SHARP stays off: on shared machines a program using NVLink multicast can take the
# host's GPUs out of service, and NVLS changes the order of sums (see [NVLS off] in
# src/comm/cuda/nccl.cu). A value already set by the caller is kept.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

# --- bookkeeping -------------------------------------------------------------------------
names=()
results=()
seconds=()
logs=()
failed=0

# step NAME LOG COMMAND...: runs COMMAND under the step timeout with its output in LOG.
step() {
  local name=$1 log=$2
  shift 2
  echo "== $name (log: $log)"
  local start rc=0
  start=$(date +%s)
  timeout --kill-after=30 "$step_timeout" "$@" >"$log" 2>&1 || rc=$?
  local status=pass
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    status="FAIL (timed out after ${step_timeout} s)"
  elif [[ $rc -ne 0 ]]; then
    status="FAIL (exit $rc)"
  fi
  [[ $status == pass ]] || failed=1
  names+=("$name")
  results+=("$status")
  seconds+=($(($(date +%s) - start)))
  logs+=("$log")
  echo "   $status"
  [[ $status == pass ]]
}

# skip NAME REASON: records a step that did not run.
skip() {
  names+=("$1")
  results+=("skipped ($2)")
  seconds+=(0)
  logs+=("-")
  echo "== $1: skipped ($2)"
}

# --- system ------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 || echo "nvcc: not found"
  "$sanitizer" --version 2>&1 || echo "compute-sanitizer: not found"
  cmake --version 2>&1 | head -1
} >"$out/system.txt" 2>&1

# --- build -------------------------------------------------------------------------------
built=0
if step build "$out/build.log" bash -c "
    cmake -S '$root' -B '$build' -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
          -DTANDEM_CUDA_ARCH=90 && cmake --build '$build' -j$jobs"; then
  if [[ -x $build/tests/tandem_gpu_tests ]]; then
    built=1
  else
    echo "   tandem_gpu_tests was not built" | tee -a "$out/build.log"
    results[-1]="FAIL (no tandem_gpu_tests)"
    failed=1
  fi
fi
gpu_tests=$build/tests/tandem_gpu_tests

# --- GPU tests ---------------------------------------------------------------------------
if [[ $built -eq 1 ]]; then
  step gpu-tests "$out/gpu_tests.log" "$gpu_tests" --gtest_output="xml:$out/gpu_tests.xml" \
    --gtest_color=no
else
  skip gpu-tests "build failed"
fi

# --- NCCL across GPUs ----------------------------------------------------------------------
# With two or more GPUs, the NCCL tests again under mpirun, one rank per GPU (each rank
# takes the GPU of its node-local rank); their expected values hold at any world size.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [[ $built -eq 1 && ${gpus:-0} -ge 2 ]] && command -v mpirun >/dev/null; then
  step nccl-mpi "$out/nccl_mpi.log" env OMPI_MCA_btl_vader_single_copy_mechanism=none \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$gpus" \
    -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS -x OMPI_MCA_btl_vader_single_copy_mechanism \
    "$gpu_tests" --gtest_filter='*NcclTest*' --gtest_color=no
elif [[ $built -eq 1 ]]; then
  skip nccl-mpi "needs 2+ GPUs and mpirun; ${gpus:-0} GPU(s)"
else
  skip nccl-mpi "build failed"
fi

# --- compute-sanitizer -------------------------------------------------------------------
# Subsets, to keep the run short and meaningful under the tools: left out are the tests
# that time concurrency (the tools serialise kernels), that provoke errors on purpose (a
# bad cudaFree, an NCCL timeout), the benchmarks and, for racecheck (shared-memory
# hazards), the NCCL tests. API errors are not reported by the tools: tandem checks every
# CUDA call itself, and the watchdog's cudaEventQuery legitimately returns
# cudaErrorNotReady. racecheck also leaves out the tests that run cuBLASLt GEMMs (matmul,
# attention, parameter gradients): racecheck reports the shared-memory pipelines of
# cuBLASLt's Hopper kernels (nvjet_sm90_*, TMA copies and mbarriers) as races, and excluding
# just those kernels (--kernel-name-exclude) makes the tool fail on them instead.
# TANDEM_MEMCHECK_FILTER / TANDEM_RACECHECK_FILTER override the test subsets.
memcheck_filter=${TANDEM_MEMCHECK_FILTER:-'CudaDeviceTest.*:*NcclTest.*:CudaKernels.*-*Concurrently*:*SyncCopies*:*BadFree*:*Timeout*'}
racecheck_filter=${TANDEM_RACECHECK_FILTER:-'CudaDeviceTest.*:CudaKernels.*-*Concurrently*:*SyncCopies*:*BadFree*:*Matmul*:*Attention*:*DeterministicParameterGradients*'}
if [[ $built -eq 1 && -x $sanitizer ]]; then
  step memcheck "$out/memcheck.log" "$sanitizer" --tool memcheck --error-exitcode 97 \
    --report-api-errors no "$gpu_tests" --gtest_filter="$memcheck_filter" --gtest_color=no
  step racecheck "$out/racecheck.log" "$sanitizer" --tool racecheck --error-exitcode 97 \
    --report-api-errors no "$gpu_tests" --gtest_filter="$racecheck_filter" --gtest_color=no
elif [[ $built -eq 1 ]]; then
  skip memcheck "compute-sanitizer not found"
  skip racecheck "compute-sanitizer not found"
  failed=1
else
  skip memcheck "build failed"
  skip racecheck "build failed"
fi

# --- BENCHMARK HOOK: training benchmarks (bench/train_gpu.sh) -----------------------------
# Not implemented yet. When bench/train_gpu.sh exists it will run here, after the tests
# pass, with its log in "$out/bench.log" and its results under "$out/bench/", e.g.
#   step bench "$out/bench.log" "$root/bench/train_gpu.sh" "$build" "$out/bench"
skip bench "not implemented yet: bench/train_gpu.sh"
# --- END BENCHMARK HOOK ------------------------------------------------------------------

# --- summary -----------------------------------------------------------------------------
{
  echo
  echo "GPU check summary ($out)"
  printf '%-12s %-52s %8s  %s\n' step result seconds log
  printf '%-12s %-52s %8s  %s\n' ------------ ---------------------------------------------------- -------- ---
  for i in "${!names[@]}"; do
    printf '%-12s %-52s %8s  %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}" "${logs[$i]}"
  done
  if [[ -f $out/gpu_tests.log ]]; then
    echo
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests? ran' "$out/gpu_tests.log" | tail -20
  fi
  echo
  if [[ $failed -eq 0 ]]; then echo "GPU check: PASS"; else echo "GPU check: FAIL"; fi
} | tee "$out/summary.txt"
exit $failed
