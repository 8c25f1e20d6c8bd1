#!/usr/bin/env bash
# GPU training throughput of tandem against PyTorch on one GPU, measured in the same run:
# tandem `none` and `full` on GPT-2 124M (batch 16) and GPT-2 1.5B (batch 8), sequences of
# 1024 random tokens, next to bench/torch_reference.py (124M: eager, torch.compile, FSDP2 at
# one rank; 1.5B: eager). Prints a Markdown table (tokens/s, ms/step, model TFLOP/s, peak
# memory, ratio to PyTorch eager, the full-vs-none gap) and writes it to OUTDIR/results.md,
# with every number in OUTDIR/results.json.
#
#   bench/train_gpu.sh BUILD_DIR OUTDIR
#
# Builds nothing: uses BUILD_DIR/tandem. Every run has its own timeout and log
# (OUTDIR/logs/); a run that fails or times out is marked in the table and the others
# still count. Exits 1 when any run failed. Environment knobs:
#   BENCH_MODELS     models, in order (default "gpt2-124m gpt2-1558m"); llama-1b is the
#                    shape of bench/llama-1b.json, llama3-8b-8l eight blocks of llama3-8b
#                    (bench/llama3-8b-8l.json: the 8B row's blocks on an 80 GB GPU; a model
#                    with a bench/NAME.json file is given to tandem as that file)
#   BENCH_BATCH      sequences per step for every model (default: 16 for gpt2-124m and
#                    gpt2-350m, 4 for the tiny presets and llama-1b, 1 for llama3-8b and
#                    llama3-8b-8l, 8
#                    otherwise)
#   BENCH_SEQ        sequence length for every model (default 2048 for llama-1b, 8192 for
#                    llama3-8b and llama3-8b-8l, 1024 otherwise)
#   BENCH_MODEL_RECOMPUTE  per-model recompute for every row of that model, as
#                    "model=mode ..." (default "llama3-8b=unit": that shape fits one H200
#                    only with it); the PyTorch rows of such a model checkpoint every block
#   BENCH_STEPS      tandem steps per run (default 12; the first BENCH_WARMUP are dropped)
#   BENCH_WARMUP     warm-up steps (default 3); the references run BENCH_WARMUP untimed
#                    steps (5 for torch.compile) and BENCH_STEPS - BENCH_WARMUP timed ones
#   BENCH_TIMEOUT    seconds per run (default 240)
#   BENCH_KERNELS=1  also the device time of one step per kernel class (GEMMs, attention,
#                    norms, loss, optimizer, other memory-bound kernels, communication):
#                    tandem `full` under ncu (each kernel timed alone; the step is the
#                    difference of a 2- and a 3-step run) and every PyTorch row under
#                    torch.profiler, in OUTDIR/kernels-MODEL.md and .json
#   BENCH_TANDEM=0   skip the tandem rows;  BENCH_TORCH=0  skip every PyTorch row
#   BENCH_RECOMPUTE  recompute modes to add as `full` rows per model (e.g. "attention unit":
#                    rows tandem-full-recompute-attention and -unit; default none)
#   BENCH_RECOMPUTE_BLOCKS  for a model with a recompute mode (BENCH_MODEL_RECOMPUTE): rows of
#                    `full` with only the first K blocks recomputing, per K given (row
#                    tandem-full-recompute-K-blocks); "plan" asks `tandem plan` for the fewest
#                    that fit this GPU (its preset, at the memory nvidia-smi reports); "auto"
#                    lets the run choose (--recompute-blocks auto: the fewest that fit the
#                    GPU's free memory; row tandem-full-recompute-auto-blocks)
#   BENCH_LOSS_CHUNK rows per chunk size for `full` with --loss-chunk R (e.g. "4096":
#                    row tandem-full-loss-chunk-4096; default none)
#   BENCH_ISSUED=0   skip the row of `full` with --no-cuda-graph (tandem-full-issued: every
#                    step issued op by op; the other rows take the default, which at one CUDA
#                    rank captures the step on step 2 and replays it; on by default with cuda)
#   BENCH_MMA=1      add a row of `full` with the mma.sync flash kernels (tandem-full-mma:
#                    TANDEM_ATTENTION=flash), beside the default that takes Hopper's warpgroup
#                    MMA on compute capability 9.0 (head size 64 or 128)
#   BENCH_FLASH_BACKWARD  rows of `full` per wgmma backward form given, "one-pass" and/or
#                    "two-pass" (TANDEM_FLASH_BACKWARD; rows tandem-full-one-pass and
#                    tandem-full-two-pass; the wgmma kernels only: the same rows elsewhere)
#   BENCH_UPDATE_AT_GATHER=1  add rows of `none` and `full` with --update-at-gather (rows
#                    tandem-none-update-at-gather and tandem-full-update-at-gather: each unit's
#                    optimizer update beside the next step's compute, before its gather)
#   BENCH_COMPILE=0  skip torch.compile;    BENCH_FSDP2=0  skip PyTorch FSDP2
#   BENCH_TORCH_MODES  reference modes for every model (default: "eager compile fsdp2" for
#                    the first model, "eager" for the others)
#   BENCH_DEVICE     cuda (default), or cpu for a dry run of this script with tiny models
#   BENCH_PYTHON     python for the references (default: python3, else /usr/bin/python3,
#                    whichever imports torch)
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUTDIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "$1" 2>/dev/null && pwd || echo "$1")
mkdir -p "$2/logs"
out=$(cd "$2" && pwd)
tandem=$build/tandem

models=${BENCH_MODELS:-gpt2-124m gpt2-1558m}
model_recompute=${BENCH_MODEL_RECOMPUTE-llama3-8b=unit}
steps=${BENCH_STEPS:-12}
warmup=${BENCH_WARMUP:-3}
run_timeout=${BENCH_TIMEOUT:-240}
device=${BENCH_DEVICE:-cuda}
py=python3
# NVLink SHARP off, as everywhere in tandem's GPU scripts (scripts/gpu-check.sh says why).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if ((steps <= warmup)); then
  echo "train_gpu.sh: BENCH_STEPS ($steps) must exceed BENCH_WARMUP ($warmup)" >&2
  exit 2
fi

if [[ -n ${BENCH_PYTHON:-} ]]; then
  torch_py=$BENCH_PYTHON
else
  torch_py=python3
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch' >/dev/null 2>&1; then
      torch_py=$p
      break
    fi
  done
fi

batch_for() {
  if [[ -n ${BENCH_BATCH:-} ]]; then
    echo "$BENCH_BATCH"
    return
  fi
  case $1 in
    gpt2-124m | gpt2-350m) echo 16 ;;
    *-tiny | llama-1b) echo 4 ;;
    llama3-8b | llama3-8b-8l) echo 1 ;;
    *) echo 8 ;;
  esac
}

seq_for() {
  if [[ -n ${BENCH_SEQ:-} ]]; then
    echo "$BENCH_SEQ"
    return
  fi
  case $1 in
    llama-1b) echo 2048 ;;
    llama3-8b | llama3-8b-8l) echo 8192 ;;
    *) echo 1024 ;;
  esac
}

recompute_for() {  # the model's entry of BENCH_MODEL_RECOMPUTE, or none
  local kv
  for kv in $model_recompute; do
    [[ ${kv%%=*} == "$1" ]] && echo "${kv#*=}" && return
  done
  echo none
}

# One tandem row of the current model: ROW (its name after "tandem-"), STRATEGY, RECOMPUTE,
# then more train flags; row_env, when set (NAME=VALUE), goes into the run's environment.
tandem_row() {
  local row=$1 strategy=$2 rc=$3
  shift 3
  local metrics=$out/tandem-$model-$row.jsonl
  rm -f "$metrics"
  # shellcheck disable=SC2086 # row_env is one NAME=VALUE word, or nothing
  run_one "tandem-$row" "$model" "$strategy" "$batch" "$metrics" \
    "$out/logs/tandem-$model-$row.log" \
    env ${row_env:-} "$tandem" train --device "$device" --model "$model_arg" --data "$data" \
    --batch "$batch" --global-batch "$batch" --seq "$seq" --steps "$steps" \
    --strategy "$strategy" --recompute "$rc" --lr 3e-4 --progress none --metrics "$metrics" "$@"
}

fewest_blocks() {  # MODEL_ARG MODE BATCH SEQ: the fewest blocks `tandem plan` says fit this GPU
  local name mib preset
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  case $name in
    *H200*) preset=h200-sxm ;;
    *H100*) preset=h100-sxm ;;
    *) return 0 ;;
  esac
  "$tandem" plan --model "$1" --strategy full --recompute "$2" --batch "$3" --seq "$4" \
    --hardware "$preset" --mem-GiB "$(awk -v m="$mib" 'BEGIN { print m / 1024 }')" --json |
    "$py" -c 'import json, re, sys
for n in json.load(sys.stdin)["notes"]:
    m = re.search(r"--recompute-blocks (\d+)$", n)
    if m:
        print(m.group(1))'
}

torch_modes_for() {  # MODEL INDEX
  local modes
  if [[ -n ${BENCH_TORCH_MODES:-} ]]; then
    modes=$BENCH_TORCH_MODES
  elif (($2 == 0)); then
    modes="eager compile fsdp2"
  else
    modes="eager"
  fi
  [[ ${BENCH_COMPILE:-1} == 0 ]] && modes=${modes//compile/}
  [[ ${BENCH_FSDP2:-1} == 0 ]] && modes=${modes//fsdp2/}
  local -a list
  read -ra list <<<"$modes"
  echo "${list[*]}"
}

# kernels_for MODEL MODEL_ARG BATCH RECOMPUTE [--torch FILE]...: the per-class table of
# BENCH_KERNELS. ncu times each kernel alone (clocks and caches left as they are); runs of
# 2 and 3 steps differ by exactly one step's launches.
kernels_for() {
  local model=$1 model_arg=$2 batch=$3 recompute=$4
  shift 4
  local ncu n tandem_ms=()
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for n in 2 3; do
    echo "run: ncu tandem-full $model, $n steps" >&2
    timeout --kill-after=15 "$run_timeout" "$ncu" --csv --page raw --clock-control none \
      --cache-control none --metrics gpu__time_duration.sum \
      "$tandem" train --device "$device" --model "$model_arg" --data "$data" \
      --batch "$batch" --global-batch "$batch" --seq "$seq" --steps "$n" --strategy full \
      --recompute "$recompute" --lr 3e-4 --progress none \
      >"$out/logs/ncu-$model-$n.csv" 2>"$out/logs/ncu-$model-$n.log" ||
      echo "     ncu failed (see $out/logs/ncu-$model-$n.log)" >&2
  done
  if [[ -f $out/tandem-$model-full.jsonl ]]; then
    tandem_ms=(--tandem-ms "$("$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import benchlib as b
print(b.summarize_metrics(b.read_metrics(sys.argv[2]), int(sys.argv[3]))["ms_per_step"])' \
      "$here" "$out/tandem-$model-full.jsonl" "$warmup")")
  fi
  "$py" "$here/benchlib.py" kernel-report --tandem-short "$out/logs/ncu-$model-2.csv" \
    --tandem-long "$out/logs/ncu-$model-3.csv" "${tandem_ms[@]}" "$@" \
    --out "$out/kernels-$model.md" --json "$out/kernels-$model.json" \
    --title "Device time per kernel class, one step of $model ($batch x $seq)" >&2 ||
    failures=$((failures + 1))
}

manifest=$out/runs.tsv
: >"$manifest"
failures=0

# record IMPL MODEL STRATEGY BATCH STATUS SECONDS RESULT LOG COMMAND
record() {
  printf '%s\t%s\t%s\t1\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$4" "$seq" \
    "$5" "$6" "$7" "$8" "$9" >>"$manifest"
}

# run_one IMPL MODEL STRATEGY BATCH RESULT LOG COMMAND...: one timed-out, logged run.
run_one() {
  local impl=$1 model=$2 strategy=$3 batch=$4 result=$5 logf=$6
  shift 6
  echo "run: $impl $model (batch $batch x $seq): $*" >&2
  local start rc=0 status=ok
  start=$(date +%s)
  if [[ $impl == tandem-* ]]; then
    timeout --kill-after=15 "$run_timeout" "$@" >"$logf" 2>&1 || rc=$?
  else
    timeout --kill-after=15 "$run_timeout" "$@" >"$result" 2>"$logf" || rc=$?
  fi
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    status="timed out after ${run_timeout} s"
  elif [[ $rc -ne 0 ]]; then
    status="failed (exit $rc)"
  fi
  [[ $status == ok ]] || failures=$((failures + 1))
  echo "     $status ($(($(date +%s) - start)) s)" >&2
  record "$impl" "$model" "$strategy" "$batch" "$status" "$(($(date +%s) - start))" \
    "$result" "$logf" "$*"
}

if [[ ${BENCH_TANDEM:-1} != 0 && ! -x $tandem ]]; then
  echo "train_gpu.sh: no tandem binary at $tandem (build with -DTANDEM_CUDA=ON first)" >&2
fi

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
  head -1)
machine="${gpu:-no nvidia-smi} | $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) CPU cores | device $device | references: $torch_py"
start_all=$(date +%s)

i=0
for model in $models; do
  batch=$(batch_for "$model")
  seq=$(seq_for "$model")
  model_arg=$model
  [[ -f $here/$model.json ]] && model_arg=$here/$model.json
  recompute=$(recompute_for "$model")
  torch_extra=()
  [[ $recompute != none ]] && torch_extra=(--recompute)
  vocab=$("$py" "$here/benchlib.py" vocab "$model") || exit 2
  data=$out/random-$vocab.tok
  if [[ ! -f $data ]]; then
    "$py" "$here/benchlib.py" tokens --out "$data" --vocab "$vocab" --count $((1 << 21)) >&2
  fi

  if [[ ${BENCH_TANDEM:-1} != 0 ]]; then
    for strategy in none full; do
      tandem_row "$strategy" "$strategy" "$recompute"
    done
    if [[ ${BENCH_ISSUED:-1} != 0 && $device == cuda ]]; then
      tandem_row full-issued full "$recompute" --no-cuda-graph
    fi
    if [[ ${BENCH_MMA:-0} != 0 && $device == cuda ]]; then
      row_env=TANDEM_ATTENTION=flash tandem_row full-mma full "$recompute"
    fi
    for passes in ${BENCH_FLASH_BACKWARD:-}; do
      [[ $device == cuda ]] || break
      row_env=TANDEM_FLASH_BACKWARD=$passes tandem_row "full-$passes" full "$recompute"
    done
    if [[ ${BENCH_UPDATE_AT_GATHER:-0} != 0 ]]; then
      for strategy in none full; do
        tandem_row "$strategy-update-at-gather" "$strategy" "$recompute" --update-at-gather
      done
    fi
    for chunk in ${BENCH_LOSS_CHUNK:-}; do
      tandem_row "full-loss-chunk-$chunk" full "$recompute" --loss-chunk "$chunk"
    done
    for k in ${BENCH_RECOMPUTE_BLOCKS:-}; do
      [[ $recompute == none ]] && break
      if [[ $k == plan ]]; then
        k=$(fewest_blocks "$model_arg" "$recompute" "$batch" "$seq")
        if [[ -z $k ]]; then
          echo "  $model: tandem plan names no fewer blocks to recompute on this GPU" >&2
          continue
        fi
      fi
      tandem_row "full-recompute-$k-blocks" full "$recompute" --recompute-blocks "$k"
    done
    for rc in ${BENCH_RECOMPUTE:-}; do
      tandem_row "full-recompute-$rc" full "$rc"
    done
  else
    for strategy in none full; do
      record "tandem-$strategy" "$model" "$strategy" "$batch" "skipped (BENCH_TANDEM=0)" 0 - - -
    done
  fi

  kernel_files=()
  if [[ ${BENCH_TORCH:-1} != 0 ]]; then
    for mode in $(torch_modes_for "$model" "$i"); do
      w=$warmup
      [[ $mode == compile ]] && ((w < 5)) && w=5
      kernel_arg=()
      if [[ ${BENCH_KERNELS:-0} == 1 && $mode != fsdp2 ]]; then
        kernel_arg=(--kernels "$out/kernels-torch-$model-$mode.json")
        kernel_files+=(--torch "$out/kernels-torch-$model-$mode.json")
      fi
      run_one "torch-$mode" "$model" - "$batch" "$out/torch-$model-$mode.json" \
        "$out/logs/torch-$model-$mode.log" \
        env PYTHONUNBUFFERED=1 "$torch_py" "$here/torch_reference.py" --mode "$mode" \
        --model "$model" --batch "$batch" --seq "$seq" --warmup "$w" \
        --steps $((steps - warmup)) --device "$device" "${torch_extra[@]}" "${kernel_arg[@]}"
    done
  fi
  if [[ ${BENCH_KERNELS:-0} == 1 ]]; then
    kernels_for "$model" "$model_arg" "$batch" "$recompute" "${kernel_files[@]}"
  fi
  i=$((i + 1))
done
machine="$machine | all runs: $(($(date +%s) - start_all)) s"

"$py" "$here/benchlib.py" train-report --manifest "$manifest" --out-dir "$out" \
  --warmup "$warmup" --reference torch-eager --machine "$machine" \
  --title "tandem vs PyTorch, one GPU (bench/train_gpu.sh)" || failures=$((failures + 1))
((failures == 0))
