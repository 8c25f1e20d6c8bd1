#!/usr/bin/env bash
# The GPU check: one command for a GPU machine. Builds tandem with the CUDA backend into
# build-gpu (Release, sm_90), runs the GPU tests (tests/gpu) with a log and a JUnit XML
# report, runs the NCCL tests across all GPUs under mpirun when there are several, runs
# compute-sanitizer's memcheck and racecheck on a subset of the tests, then the training
# benchmark against PyTorch (bench/train_gpu.sh), the three probes (tandem probe overlap,
# links, compute) and the planner's predictions against the measured step times, then
# prints a summary table and exits nonzero if any step failed.
#
#   scripts/gpu-check.sh OUTDIR
#
# OUTDIR receives: build.log, gpu_tests.log, gpu_tests.xml, nccl_mpi.log (2+ GPUs only),
# hf_check.log and hf/, memcheck.log, racecheck.log, bench.log and bench/ (results.md,
# results.json, per-run metrics and logs), probe_overlap.log, overlap.json, overlap_trace.json, probe_links.log,
# links.json, probe_compute.log, compute.json, probe_compute_MODEL.log and compute_MODEL.json
# (kernel tables of each benchmarked shape and of bench/llama-1b.json), plan.log,
# plan_vs_measured.md and .json,
# system.txt and summary.txt. Where a machine hands back only a few files of a run,
# scripts/gpu-pack.sh OUTDIR DEST [CONSOLE_LOG] packs them into at most eight.
#
# Environment knobs (each step can be left out, so a short run fits a time limit):
#   TANDEM_BUILD              build folder (default build-gpu)
#   TANDEM_GPU_BUILD=0        skip the build and use what TANDEM_BUILD already holds
#   TANDEM_GPU_TARGETS        targets to build: unset builds everything; "min" builds only
#                             tandem and tandem_gpu_tests; any other value is a target list
#   TANDEM_GPU_TESTS=0        skip the GPU tests and the NCCL tests under mpirun
#   TANDEM_GPU_GEMM_ATTENTION=0  skip the engine tests again with the GEMM attention
#   TANDEM_GPU_HF=0           skip scripts/hf-check.sh (exports loaded by transformers)
#   TANDEM_GPU_SANITIZERS=0   skip memcheck and racecheck
#   TANDEM_GPU_BENCH=0        skip bench/train_gpu.sh (its own BENCH_* knobs pass through,
#                             e.g. BENCH_COMPILE=0 to leave torch.compile out)
#   TANDEM_GPU_PROBES=0       skip the three probes
#   TANDEM_GPU_PLAN=0         skip the planner comparison (it needs bench/results.json)
#   TANDEM_GPU_STEP_TIMEOUT   seconds per step (default 1800)
#   TANDEM_GPU_WGMMA_TIMEOUT  seconds for the wgmma step, which runs the wgmma flash tests
#                             before the others (default 240); if it fails, the other test
#                             steps leave those tests out and the sanitizers are skipped
#   GTEST_FILTER              the tests of the gpu-tests step (default: all)
#   TANDEM_MEMCHECK_FILTER, TANDEM_RACECHECK_FILTER: the sanitizer test subsets (below)
# e.g. tests only: TANDEM_GPU_BENCH=0 TANDEM_GPU_PROBES=0 TANDEM_GPU_PLAN=0; measurements
# only, on a build made by an earlier call: TANDEM_GPU_BUILD=0 TANDEM_GPU_TESTS=0
# TANDEM_GPU_SANITIZERS=0.
#
# Expects the GPU machine's preinstalled toolchain (Ubuntu 24.04, g++ 13, CMake 4, CUDA
# 13.0 with compute-sanitizer, NCCL 2.28, OpenMPI, OpenBLAS, nlohmann-json, CLI11, fmt,
# GoogleTest) and, for the benchmark's references, the python3 that holds PyTorch; needs
# no network.
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
wgmma_failed=0
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)

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
# built: the test binary is there; have_tandem: the CLI is there (bench, probes, plan).
targets=${TANDEM_GPU_TARGETS:-}
[[ $targets == min ]] && targets="tandem tandem_gpu_tests"
target_flags=""
for t in $targets; do target_flags+=" --target $t"; done
built=0
build_ok=1
if [[ ${TANDEM_GPU_BUILD:-1} == 0 ]]; then
  skip build "TANDEM_GPU_BUILD=0: using $build"
elif ! step build "$out/build.log" bash -c "
    cmake -S '$root' -B '$build' -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
          -DTANDEM_CUDA_ARCH=90 && cmake --build '$build' -j$jobs$target_flags"; then
  build_ok=0
fi
need_tests=1
[[ ${TANDEM_GPU_TESTS:-1} == 0 && ${TANDEM_GPU_SANITIZERS:-1} == 0 ]] && need_tests=0
if [[ -x $build/tests/tandem_gpu_tests ]]; then
  built=$build_ok
elif [[ $build_ok -eq 1 && $need_tests -eq 1 ]]; then
  echo "   tandem_gpu_tests was not built" | tee -a "$out/build.log"
  [[ ${TANDEM_GPU_BUILD:-1} == 0 ]] || results[-1]="FAIL (no tandem_gpu_tests)"
  failed=1
fi
have_tandem=0
[[ $build_ok -eq 1 && -x $build/tandem ]] && have_tandem=1
gpu_tests=$build/tests/tandem_gpu_tests
tandem=$build/tandem

# --- GPU tests ---------------------------------------------------------------------------
if [[ ${TANDEM_GPU_TESTS:-1} == 0 ]]; then
  skip gpu-tests "TANDEM_GPU_TESTS=0"
elif [[ $built -eq 1 ]]; then
  # The wgmma flash kernels first, alone and under a short timeout: kernels new to a GPU could
  # hang, and a hang inside the whole run would take the rest of the call with it. If they fail
  # or time out, the whole run leaves them out (their failure is already recorded).
  wgmma_filter='CudaWgmma.*:CudaFlash.WgmmaMatchesTheReference:*CudaEngine.WgmmaFlash*'
  rest_filter=${GTEST_FILTER:-*}
  saved_timeout=$step_timeout
  step_timeout=${TANDEM_GPU_WGMMA_TIMEOUT:-240}
  rest_env=()
  if ! step wgmma "$out/gpu_tests_wgmma.log" env -u GTEST_FILTER "$gpu_tests" \
    --gtest_filter="$wgmma_filter" --gtest_color=no; then
    wgmma_failed=1
    # Every test that names the wgmma kernels where the GPU has them; the others run with the
    # mma.sync kernels in place of the default's wgmma (TANDEM_ATTENTION=flash).
    wgmma_users="$wgmma_filter:CudaFlash.RepeatsBitwiseWithoutOtherKernels:CudaFlash.Timing"
    [[ $rest_filter == *-* ]] && rest_filter="$rest_filter:$wgmma_users" ||
      rest_filter="$rest_filter-$wgmma_users"
    rest_env=(TANDEM_ATTENTION=flash)
  fi
  step_timeout=$saved_timeout
  step gpu-tests "$out/gpu_tests.log" env -u GTEST_FILTER "${rest_env[@]}" "$gpu_tests" \
    --gtest_filter="$rest_filter" --gtest_output="xml:$out/gpu_tests.xml" --gtest_color=no
  # The engine's tests again with the GEMM attention (flash attention is the default for the
  # tiny models' head size), so both attention paths train correctly end to end.
  if [[ ${TANDEM_GPU_GEMM_ATTENTION:-1} == 0 ]]; then
    skip gemm-attention "TANDEM_GPU_GEMM_ATTENTION=0"
  else
    step gemm-attention "$out/gpu_tests_gemm_attention.log" env TANDEM_ATTENTION=gemm \
      "$gpu_tests" --gtest_filter='*CudaEngine.Bf16*:*CudaEngine.DelayedProducers*' \
      --gtest_color=no
  fi
else
  skip gpu-tests "build failed"
fi

# --- Hugging Face round trip ---------------------------------------------------------------
# scripts/hf-check.sh: tandem's exports load in transformers with the reference logits, and
# fine-tuning from Hugging Face weights runs on the GPU as on the CPU.
if [[ ${TANDEM_GPU_HF:-1} == 0 ]]; then
  skip hf "TANDEM_GPU_HF=0"
elif [[ $have_tandem -eq 1 ]]; then
  step hf "$out/hf_check.log" "$root/scripts/hf-check.sh" "$build" "$out/hf"
else
  skip hf "no tandem binary"
fi

# --- NCCL across GPUs ----------------------------------------------------------------------
# With two or more GPUs, the NCCL tests again under mpirun, one rank per GPU (each rank
# takes the GPU of its node-local rank); their expected values hold at any world size.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [[ ${TANDEM_GPU_TESTS:-1} == 0 ]]; then
  skip nccl-mpi "TANDEM_GPU_TESTS=0"
elif [[ $built -eq 1 && ${gpus:-0} -ge 2 ]] && command -v mpirun >/dev/null; then
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
memcheck_filter=${TANDEM_MEMCHECK_FILTER:-'CudaDeviceTest.*:*NcclTest.*:CudaKernels.*:CudaFlash.*:CudaWgmma.*:CudaEngine.DelayedProducers*-*Concurrently*:*SyncCopies*:*BadFree*:*Timeout*:*Timing*'}
racecheck_filter=${TANDEM_RACECHECK_FILTER:-'CudaDeviceTest.*:CudaKernels.*-*Concurrently*:*SyncCopies*:*BadFree*:*Matmul*:*Attention*:*DeterministicParameterGradients*'}
if [[ ${TANDEM_GPU_SANITIZERS:-1} == 0 ]]; then
  skip memcheck "TANDEM_GPU_SANITIZERS=0"
  skip racecheck "TANDEM_GPU_SANITIZERS=0"
elif [[ $wgmma_failed -eq 1 ]]; then
  # Their filters run the wgmma kernels too, which failed or hung above.
  skip memcheck "the wgmma step failed"
  skip racecheck "the wgmma step failed"
elif [[ $built -eq 1 && -x $sanitizer ]]; then
  step memcheck "$out/memcheck.log" "$sanitizer" --tool memcheck --error-exitcode 97 \
    --report-api-errors no "$gpu_tests" --gtest_filter="$memcheck_filter" --gtest_color=no
  step racecheck "$out/racecheck.log" "$sanitizer" --tool racecheck --error-exitcode 97 \
    --report-api-errors no "$gpu_tests" --gtest_filter="$racecheck_filter" --gtest_color=no
  # The flash attention kernels share memory between warps through cp.async pipelines; their
  # other tests also run cuBLASLt (see above), so one test runs them alone for racecheck.
  step racecheck-flash "$out/racecheck_flash.log" "$sanitizer" --tool racecheck \
    --error-exitcode 97 --report-api-errors no "$gpu_tests" \
    --gtest_filter='CudaFlash.RepeatsBitwiseWithoutOtherKernels' --gtest_color=no
elif [[ $built -eq 1 ]]; then
  skip memcheck "compute-sanitizer not found"
  skip racecheck "compute-sanitizer not found"
  failed=1
else
  skip memcheck "build failed"
  skip racecheck "build failed"
fi

# --- training benchmark ------------------------------------------------------------------
# tandem none/full on GPT-2 124M and 1.5B against PyTorch eager, torch.compile and FSDP2,
# measured in this run (bench/README.md). It runs whether or not the tests passed: each of
# its rows stands alone, and a failed row is marked in its table.
if [[ ${TANDEM_GPU_BENCH:-1} == 0 ]]; then
  skip bench "TANDEM_GPU_BENCH=0"
elif [[ $have_tandem -eq 1 ]]; then
  step bench "$out/bench.log" "$root/bench/train_gpu.sh" "$build" "$out/bench"
else
  skip bench "no tandem binary"
fi

# --- probes ------------------------------------------------------------------------------
# docs/diagnosis.md. With several GPUs, overlap and links run on all of them (--ranks).
probe_ranks=()
[[ ${gpus:-0} -ge 2 ]] && probe_ranks=(--ranks "$gpus")
if [[ ${TANDEM_GPU_PROBES:-1} == 0 ]]; then
  skip probe-overlap "TANDEM_GPU_PROBES=0"
  skip probe-links "TANDEM_GPU_PROBES=0"
  skip probe-compute "TANDEM_GPU_PROBES=0"
elif [[ $have_tandem -eq 1 ]]; then
  # The JSON goes to overlap.json; the log keeps stderr and a copy of it.
  # shellcheck disable=SC2016 # "$@" and "$0" belong to the inner shell
  step probe-overlap "$out/probe_overlap.log" bash -c 'set -o pipefail; "$@" | tee "$0"' \
    "$out/overlap.json" "$tandem" probe overlap --device cuda "${probe_ranks[@]}" --json \
    --trace "$out/overlap_trace.json"
  step probe-links "$out/probe_links.log" "$tandem" probe links --device cuda \
    "${probe_ranks[@]}" --save "$out/links.json"
  step probe-compute "$out/probe_compute.log" "$tandem" probe compute --device cuda \
    --save "$out/compute.json"
  # Kernel tables of each benchmarked row's own shapes (bench/train_gpu.sh: its models at its
  # batch rule and BENCH_SEQ) and of the Llama-1B shape (bench/llama-1b.json at 4 x 2048),
  # for the planner comparison below: compute_NAME.json.
  for model in ${BENCH_MODELS:-gpt2-124m gpt2-1558m} llama-1b; do
    case $model in
      llama-1b) spec=("$root/bench/llama-1b.json" 4 2048) ;;
      gpt2-124m | gpt2-350m) spec=("$model" "${BENCH_BATCH:-16}" "${BENCH_SEQ:-1024}") ;;
      *-tiny) spec=("$model" "${BENCH_BATCH:-4}" "${BENCH_SEQ:-1024}") ;;
      *) spec=("$model" "${BENCH_BATCH:-8}" "${BENCH_SEQ:-1024}") ;;
    esac
    step "probe-$model" "$out/probe_compute_$model.log" "$tandem" probe compute --device cuda \
      --model "${spec[0]}" --batch "${spec[1]}" --seq "${spec[2]}" \
      --save "$out/compute_$model.json"
  done
else
  skip probe-overlap "no tandem binary"
  skip probe-links "no tandem binary"
  skip probe-compute "no tandem binary"
fi

# --- planner against measurement ---------------------------------------------------------
# tandem plan (h200-sxm preset, overridden by the row's own compute_MODEL.json, with its
# kernel tables, or else compute.json, and, when measured on 2+ ranks, links.json) for each
# measured tandem row of the benchmark: predicted against measured
# step time and exposed communication, in plan_vs_measured.md. Informative: an estimate off
# by more than 15% is marked, not failed.
if [[ ${TANDEM_GPU_PLAN:-1} == 0 ]]; then
  skip plan "TANDEM_GPU_PLAN=0"
elif [[ $have_tandem -ne 1 ]]; then
  skip plan "no tandem binary"
elif [[ ! -f $out/bench/results.json ]]; then
  skip plan "no bench/results.json"
else
  step plan "$out/plan.log" python3 "$root/bench/benchlib.py" plan-vs-measured \
    --tandem "$tandem" --results "$out/bench/results.json" --compute "$out/compute.json" \
    --compute-dir "$out" --links "$out/links.json" --hardware h200-sxm \
    --out "$out/plan_vs_measured.md" \
    --json "$out/plan_vs_measured.json" --title "tandem plan against bench/train_gpu.sh"
fi

# --- summary -----------------------------------------------------------------------------
{
  echo
  echo "GPU check summary ($out)"
  printf '%-14s %-52s %8s  %s\n' step result seconds log
  printf '%-14s %-52s %8s  %s\n' -------------- ---------------------------------------------------- -------- ---
  for i in "${!names[@]}"; do
    printf '%-14s %-52s %8s  %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}" "${logs[$i]}"
  done
  if [[ -f $out/gpu_tests.log ]]; then
    echo
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests? ran' "$out/gpu_tests.log" | tail -20
  fi
  for f in "$out/bench/results.md" "$out/plan_vs_measured.md"; do
    if [[ -f $f ]]; then
      echo
      grep -E '^\|' "$f"
    fi
  done
  echo
  if [[ $failed -eq 0 ]]; then echo "GPU check: PASS"; else echo "GPU check: FAIL"; fi
} | tee "$out/summary.txt"
exit $failed
