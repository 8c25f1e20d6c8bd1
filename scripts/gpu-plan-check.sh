#!/usr/bin/env bash
# The planner against measurement on one GPU, short (about 5 minutes on one H200 once built).
# For each shape of bench/train_gpu.sh's rows and a Llama-1B shape:
#
#   gpt2-124m            batch 16 x seq 1024
#   gpt2-1558m           batch  8 x seq 1024
#   bench/llama-1b.json  batch  4 x seq 2048  (d_model 2048, 16 layers, 16 heads, 8 KV heads,
#                                              d_ff 5632, vocabulary 32000)
#
# it runs
#   tandem probe compute --device cuda --model M --batch B --seq T --save OUTDIR/compute_NAME.json
#   tandem plan --model M --batch B --seq T --strategy S --hardware H --compute that --json
#   tandem train --device cuda ... --steps N on random tokens, with --hardware H
#                --hardware-compute that (so train's own prediction uses the same tables)
# and prints predicted (the plan) next to measured (the median step of the run, steps 3..N)
# with error = predicted / measured - 1, and train's own prediction line.
#
#   scripts/gpu-plan-check.sh OUTDIR
#
# Uses $TANDEM_BUILD/tandem (default build-gpu); when it is missing, builds only `tandem` with
# the CUDA backend (sm_90) first, as scripts/gpu-check.sh does with TANDEM_GPU_TARGETS=min.
# Knobs: PLAN_CHECK_MODELS (names, default "gpt2-124m gpt2-1558m llama-1b"), PLAN_CHECK_STEPS
# (30), PLAN_CHECK_STRATEGY (full), PLAN_CHECK_HARDWARE (h200-sxm; the compute file overrides
# its figures), PLAN_CHECK_TIMEOUT (seconds per command, 300); PLAN_CHECK_DEVICE=cpu with
# PLAN_CHECK_MODELS=gpt2-tiny and PLAN_CHECK_HARDWARE=cpu-local is a dry run on a CPU.
# OUTDIR receives compute_NAME.json and .log, plan_NAME.json, train_NAME.log and .jsonl,
# tokens files and summary.txt.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
build=${TANDEM_BUILD:-$root/build-gpu}
tandem=$build/tandem
steps=${PLAN_CHECK_STEPS:-30}
strategy=${PLAN_CHECK_STRATEGY:-full}
hardware=${PLAN_CHECK_HARDWARE:-h200-sxm}
limit=${PLAN_CHECK_TIMEOUT:-300}
models=${PLAN_CHECK_MODELS:-gpt2-124m gpt2-1558m llama-1b}
device=${PLAN_CHECK_DEVICE:-cuda}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # as in every GPU script (gpu-check.sh says why)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

if [[ ! -x $tandem ]]; then
  echo "== building $tandem (log: $out/build.log)"
  if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
    -DTANDEM_CUDA_ARCH=90 && cmake --build "$build" -j"$(nproc)" --target tandem; } \
    >"$out/build.log" 2>&1; then
    echo "build failed: see $out/build.log" >&2
    exit 1
  fi
fi

# NAME -> model argument, batch, seq, vocabulary
shape_of() {
  case $1 in
    gpt2-124m) echo "gpt2-124m 16 1024 50257" ;;
    gpt2-1558m) echo "gpt2-1558m 8 1024 50257" ;;
    llama-1b) echo "$root/bench/llama-1b.json 4 2048 32000" ;;
    gpt2-tiny) echo "gpt2-tiny 4 64 256" ;;  # a dry run of this script on a CPU
    *)
      echo "gpu-plan-check: unknown shape '$1' (known: gpt2-124m gpt2-1558m llama-1b gpt2-tiny)" >&2
      return 1
      ;;
  esac
}

failed=0
rows=()
start_all=$(date +%s)
for name in $models; do
  read -r model batch seq vocab <<<"$(shape_of "$name")" || exit 2
  data=$out/random-$vocab.tok
  [[ -f $data ]] || python3 "$root/bench/benchlib.py" tokens --out "$data" --vocab "$vocab" \
    --count $((1 << 21)) >/dev/null
  compute=$out/compute_$name.json
  echo "== $name: batch $batch x seq $seq"
  t0=$(date +%s)
  if ! timeout "$limit" "$tandem" probe compute --device "$device" --model "$model" --batch "$batch" \
    --seq "$seq" --save "$compute" >"$out/compute_$name.log" 2>&1; then
    echo "   probe failed: see $out/compute_$name.log"
    rows+=("$name|probe failed")
    failed=1
    continue
  fi
  echo "   probe: $(($(date +%s) - t0)) s"
  if ! timeout "$limit" "$tandem" plan --model "$model" --batch "$batch" --seq "$seq" \
    --strategy "$strategy" --hardware "$hardware" --compute "$compute" --json \
    >"$out/plan_$name.json" 2>"$out/plan_$name.err"; then
    echo "   plan failed: see $out/plan_$name.err"
    rows+=("$name|plan failed")
    failed=1
    continue
  fi
  metrics=$out/train_$name.jsonl
  rm -f "$metrics"
  t0=$(date +%s)
  if ! timeout "$limit" "$tandem" train --device "$device" --model "$model" --data "$data" \
    --batch "$batch" --global-batch "$batch" --seq "$seq" --steps "$steps" \
    --strategy "$strategy" --lr 3e-4 --progress none --metrics "$metrics" \
    --hardware "$hardware" --hardware-compute "$compute" >"$out/train_$name.log" 2>&1; then
    echo "   train failed: see $out/train_$name.log"
    rows+=("$name|train failed")
    failed=1
    continue
  fi
  echo "   train: $(($(date +%s) - t0)) s; $(grep -m1 '^predicted' "$out/train_$name.log")"
  rows+=("$(python3 - "$out/plan_$name.json" "$metrics" "$name" "$batch" "$seq" <<'EOF'
import json, sys
plan = json.load(open(sys.argv[1]))
s = plan["strategies"][0]
summary = [json.loads(l) for l in open(sys.argv[2]) if '"summary"' in l][-1]
measured = summary["measured"]["step_ms"]
own = (summary.get("predicted") or {}).get("step_ms")
k = plan.get("kernel_cost") or {}
priced = (f"{k.get('measured', 0)}/{k.get('calls', 0)} calls measured, "
          f"{k.get('interpolated', 0)} interpolated, {k.get('ceiling', 0)} at the ceilings")
print(f"{sys.argv[3]}|{sys.argv[4]} x {sys.argv[5]}|{s['step_ms']:.1f}|"
      f"{own if own is None else round(own, 1)}|{measured:.1f}|"
      f"{100 * (s['step_ms'] / measured - 1):+.1f}%|{priced}")
EOF
)")
done

{
  echo
  echo "tandem plan against tandem train on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" \
    "(strategy $strategy, --hardware $hardware with each shape's compute file; $steps steps, median of steps 3..$steps; $(($(date +%s) - start_all)) s in all)"
  echo "error = predicted / measured - 1"
  echo
  printf '%-11s %-12s %14s %16s %12s %8s  %s\n' model "batch x seq" "predicted ms" \
    "train's own ms" "measured ms" error "kernel calls per micro-step"
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c d e f g <<<"$r"
    printf '%-11s %-12s %14s %16s %12s %8s  %s\n' "$a" "$b" "$c" "$d" "$e" "$f" "$g"
  done
} | tee "$out/summary.txt"
exit $failed
