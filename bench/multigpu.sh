#!/usr/bin/env bash
# tandem on several GPUs of one host (2, 4 or 8 H200s; one GPU works as a smoke test):
#   equiv    the same training on N GPUs as on one: gpt2-tiny and llama-tiny, 50 steps,
#            every strategy (full, grad-op, none; hybrid with shard groups of 2 from 4
#            GPUs), loss curves compared with a one-GPU run within a bf16 tolerance
#   scaling  gpt2-1558m (seq 1024) and llama2-7b (seq 2048) with `full` on N GPUs against
#            PyTorch FSDP2 (bench/torch_reference.py under torchrun) on the same GPUs
#   overlap  tandem probe overlap on N GPUs, with a trace
#   links    tandem probe links on N GPUs: all-gather / reduce-scatter busbw at 1 GiB
#            against 370 GB/s; tandem probe compute for the planner
#   plan     tandem plan for each scaling run against its measured step time (within 15%)
# Writes OUTDIR/multigpu.md (every part's section) and, per part, its files and logs.
#
#   bench/multigpu.sh BUILD_DIR OUTDIR
#
# Builds nothing: uses BUILD_DIR/tandem (-DTANDEM_CUDA=ON). NVLink SHARP stays off
# (NCCL_NVLS_ENABLE=0 and PyTorch's and NVSHMEM's multicast switches), whatever the caller
# set: on shared machines NVLink multicast can take the host's GPUs out of service.
# Exits 1 when a run failed, a loss curve left its tolerance or a prediction missed by more
# than 15%. Environment knobs:
#   MG_PARTS          parts to run, in order (default "equiv scaling overlap links plan";
#                     plan reads scaling's results and links' files from OUTDIR)
#   MG_RANKS          GPUs to use (default: every GPU nvidia-smi lists)
#   MG_TIMEOUT        seconds per run (default 600)
#   MG_DEVICE         cuda (default), or cpu for a dry run of this script (set MG_RANKS and
#                     tiny MG_SCALE_MODELS; the FSDP2 reference needs a PyTorch with CPU
#                     FSDP2 then)
#   equiv:   MG_EQ_MODELS ("gpt2-tiny llama-tiny"), MG_EQ_STEPS (50), MG_EQ_SEQ (128),
#            MG_EQ_GLOBAL (global batch, 16; must divide by MG_RANKS), MG_EQ_LR (1e-3),
#            MG_EQ_RTOL (0.01), MG_EQ_RTOL_FIRST (0.002)
#   scaling: MG_SCALE_MODELS (default "gpt2-1558m llama2-7b", "gpt2-124m" on one GPU),
#            MG_SCALE_RANKS (GPU counts, default MG_RANKS; e.g. "1 2 4 8"), MG_STEPS (12),
#            MG_WARMUP (3), MG_LLAMA_SEQ (2048), MG_LLAMA_BATCH (2 per GPU),
#            MG_GPT_BATCH (8 per GPU for gpt2-1558m, 16 for smaller), MG_SCALE_SEQ (every
#            model's sequence length, instead of 1024 / MG_LLAMA_SEQ), MG_TORCH=0 (no FSDP2)
#   plan:    MG_PLAN_TOL (0.15)
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUTDIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "$1" 2>/dev/null && pwd || echo "$1")
mkdir -p "$2/logs"
out=$(cd "$2" && pwd)
tandem=$build/tandem
py=python3

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
device=${MG_DEVICE:-cuda}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
ranks=${MG_RANKS:-${gpus:-0}}
parts=${MG_PARTS:-equiv scaling overlap links plan}
run_timeout=${MG_TIMEOUT:-600}
if ! [[ $ranks =~ ^[0-9]+$ ]] || ((ranks < 1)); then
  echo "multigpu.sh: no GPU found (nvidia-smi -L) and MG_RANKS not set" >&2
  exit 2
fi
if [[ ! -x $tandem ]]; then
  echo "multigpu.sh: no tandem binary at $tandem (build with -DTANDEM_CUDA=ON)" >&2
  exit 2
fi
torch_py=python3
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import torch' >/dev/null 2>&1; then
    torch_py=$p
    break
  fi
done

failures=0
part_names=()
part_results=()

# ranks_flag N: tandem's --ranks for N GPUs (none for one: the plain single process).
ranks_flag() { (($1 > 1)) && echo "--ranks $1"; }

# run_timed LOG COMMAND...: runs COMMAND under the timeout with its output in LOG; prints
# and returns its status word (ok, timed out, failed (exit N)).
run_timed() {
  local logf=$1 rc=0 start
  shift
  start=$(date +%s)
  echo "run: $*" >&2
  timeout --kill-after=20 "$run_timeout" "$@" >"$logf" 2>&1 || rc=$?
  local status=ok
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    status="timed out after ${run_timeout} s"
  elif [[ $rc -ne 0 ]]; then
    status="failed (exit $rc)"
  fi
  echo "     $status ($(($(date +%s) - start)) s)" >&2
  echo "$status"
}

finish_part() {  # NAME STATUS
  part_names+=("$1")
  part_results+=("$2")
  [[ $2 == pass || $2 == skipped* ]] || failures=$((failures + 1))
}

# --- equiv: loss curves on N GPUs against one --------------------------------------------
part_equiv() {
  local md=$out/equivalence.md steps=${MG_EQ_STEPS:-50} seq=${MG_EQ_SEQ:-128}
  local global=${MG_EQ_GLOBAL:-16} lr=${MG_EQ_LR:-1e-3} status=pass
  if ((global % ranks != 0)); then
    echo "multigpu.sh: MG_EQ_GLOBAL $global does not divide by $ranks GPUs" >&2
    finish_part equiv "FAIL (global batch $global, $ranks GPUs)"
    return
  fi
  mapfile -t texts < <(cd "$root" && find README.md docs src -type f \
    \( -name '*.md' -o -name '*.h' -o -name '*.cpp' -o -name '*.cu' \) | sort)
  (cd "$root" && "$tandem" data prepare --text "${texts[@]}" --out "$out/corpus.tok") \
    >"$out/logs/corpus.log" 2>&1 || {
    finish_part equiv "FAIL (tandem data prepare)"
    return
  }
  {
    echo "# Equivalence: $ranks GPU(s) against 1"
    echo
    echo "Byte-level corpus (tandem's docs and sources), $steps steps, global batch $global x" \
      "seq $seq (batch $((global / ranks)) per GPU on $ranks GPUs), lr $lr, seed 1337." \
      "Reference: the same run on one GPU with \`full\`. Tolerance: bf16 activations and" \
      "gathered parameters with fp32 reductions; the order of the gradient sums (per rank," \
      "then across ranks) and the GEMM shapes differ with the GPU count, so curves agree to" \
      "rounding at step 1 and drift slowly after."
    echo
  } >"$md"
  local strategies="full grad-op none"
  ((ranks >= 4)) && strategies+=" hybrid"
  for model in ${MG_EQ_MODELS:-gpt2-tiny llama-tiny}; do
    local common=(train --device "$device" --model "$model" --data "$out/corpus.tok"
      --seq "$seq" --global-batch "$global" --steps "$steps" --lr "$lr" --progress none)
    local ref=$out/eq-$model-1gpu-full.jsonl
    local st
    st=$(run_timed "$out/logs/eq-$model-1gpu-full.log" "$tandem" "${common[@]}" \
      --batch "$global" --strategy full --metrics "$ref")
    if [[ $st != ok ]]; then
      echo "- $model: the one-GPU reference run $st (logs/eq-$model-1gpu-full.log)" >>"$md"
      status="FAIL"
      continue
    fi
    local runs=()
    for strategy in $strategies; do
      local m=$out/eq-$model-${ranks}gpu-$strategy.jsonl extra=()
      [[ $strategy == hybrid ]] && extra=(--shard-group 2)
      # shellcheck disable=SC2046 # ranks_flag is empty or two words
      st=$(run_timed "$out/logs/eq-$model-${ranks}gpu-$strategy.log" "$tandem" "${common[@]}" \
        $(ranks_flag "$ranks") --batch $((global / ranks)) --strategy "$strategy" \
        "${extra[@]}" --metrics "$m")
      [[ $st == ok ]] || status="FAIL"
      runs+=(--run "$ranks GPU(s) $strategy=$m")
    done
    "$py" "$here/benchlib.py" compare-losses --reference "$ref" "${runs[@]}" \
      --rtol "${MG_EQ_RTOL:-0.01}" --rtol-first "${MG_EQ_RTOL_FIRST:-0.002}" \
      --out "$md" --append --title "$model" >/dev/null || status="FAIL"
  done
  finish_part equiv "$status"
}

# --- scaling: tandem full against PyTorch FSDP2 --------------------------------------------
part_scaling() {
  local steps=${MG_STEPS:-12} warmup=${MG_WARMUP:-3} manifest=$out/scaling_runs.tsv
  local default_models="gpt2-1558m llama2-7b"
  ((ranks == 1)) && default_models="gpt2-124m"
  : >"$manifest"
  for model in ${MG_SCALE_MODELS:-$default_models}; do
    local seq=1024 batch vocab
    case $model in
      llama*) seq=${MG_LLAMA_SEQ:-2048} batch=${MG_LLAMA_BATCH:-2} ;;
      gpt2-1558m | gpt2-774m) batch=${MG_GPT_BATCH:-8} ;;
      *) batch=${MG_GPT_BATCH:-16} ;;
    esac
    seq=${MG_SCALE_SEQ:-$seq}
    vocab=$("$py" "$here/benchlib.py" vocab "$model") || continue
    local data=$out/random-$vocab.tok
    [[ -f $data ]] || "$py" "$here/benchlib.py" tokens --out "$data" --vocab "$vocab" >&2
    for n in ${MG_SCALE_RANKS:-$ranks}; do
      local tag=$model-${n}gpu st start
      local m=$out/scale-tandem-$tag.jsonl
      start=$(date +%s)
      # shellcheck disable=SC2046 # ranks_flag is empty or two words
      st=$(run_timed "$out/logs/scale-tandem-$tag.log" "$tandem" train --device "$device" \
        $(ranks_flag "$n") --strategy full --model "$model" --data "$data" --batch "$batch" \
        --global-batch $((batch * n)) --seq "$seq" --steps "$steps" --lr 3e-4 \
        --progress none --metrics "$m")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' tandem-full "$model" full "$n" \
        "$batch" $((batch * n)) "$seq" "$st" $(($(date +%s) - start)) "$m" \
        "$out/logs/scale-tandem-$tag.log" "tandem train --strategy full" >>"$manifest"
      [[ ${MG_TORCH:-1} == 0 ]] && continue
      local launch=("$torch_py")
      ((n > 1)) && launch=("$torch_py" -m torch.distributed.run --standalone --nproc_per_node "$n")
      local j=$out/scale-torch-$tag.json
      start=$(date +%s)
      st=$(run_timed "$out/logs/scale-torch-$tag.log" env PYTHONUNBUFFERED=1 "${launch[@]}" \
        "$here/torch_reference.py" --mode fsdp2 --model "$model" --batch "$batch" \
        --seq "$seq" --warmup "$warmup" --steps $((steps - warmup)) --device "$device")
      # The reference's JSON line is in its log (stdout and stderr together).
      grep '^{' "$out/logs/scale-torch-$tag.log" | tail -1 >"$j"
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' torch-fsdp2 "$model" - "$n" \
        "$batch" $((batch * n)) "$seq" "$st" $(($(date +%s) - start)) "$j" \
        "$out/logs/scale-torch-$tag.log" "torch_reference.py --mode fsdp2" >>"$manifest"
    done
  done
  local gpu
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  if "$py" "$here/benchlib.py" train-report --manifest "$manifest" --out-dir "$out" \
    --name scaling --warmup "$warmup" --reference torch-fsdp2 \
    --machine "${gpus:-0} x ${gpu:-no GPU}, device $device, NCCL_NVLS_ENABLE=0" \
    --title "Scaling: tandem full against PyTorch FSDP2 (bench/multigpu.sh)" >/dev/null; then
    finish_part scaling pass
  else
    finish_part scaling FAIL
  fi
}

# --- overlap probe -------------------------------------------------------------------------
part_overlap() {
  local st
  # shellcheck disable=SC2046 # ranks_flag is empty or two words
  st=$(run_timed "$out/overlap.txt" "$tandem" probe overlap --device "$device" \
    $(ranks_flag "$ranks") --trace "$out/overlap_trace.json")
  {
    echo "# tandem probe overlap on $ranks GPU(s)"
    echo
    echo '```'
    cat "$out/overlap.txt"
    echo '```'
    echo
    echo "Trace: overlap_trace.json (Perfetto / chrome://tracing)."
  } >"$out/overlap.md"
  if [[ $st == ok ]]; then
    finish_part overlap pass
  else
    finish_part overlap "FAIL ($st)"
  fi
}

# --- links and compute probes --------------------------------------------------------------
part_links() {
  local st status=pass
  # shellcheck disable=SC2046 # ranks_flag is empty or two words
  st=$(run_timed "$out/links.txt" "$tandem" probe links --device "$device" \
    $(ranks_flag "$ranks") --save "$out/links.json")
  [[ $st == ok ]] || status="FAIL (links $st)"
  st=$(run_timed "$out/compute.txt" "$tandem" probe compute --device "$device" \
    --save "$out/compute.json")
  [[ $st == ok ]] || status="FAIL (compute $st)"
  if [[ -f $out/links.json ]]; then
    "$py" "$here/benchlib.py" links-report --links "$out/links.json" --out "$out/links.md" \
      --size 1GiB --target-GBps 370 --title "tandem probe links on $ranks GPU(s)" \
      >/dev/null || status=FAIL
  else
    echo "# tandem probe links: no links.json (see links.txt)" >"$out/links.md"
  fi
  finish_part links "$status"
}

# --- planner against the scaling runs ------------------------------------------------------
part_plan() {
  if [[ ! -f $out/scaling.json ]]; then
    echo "# Planner: no scaling.json (run the scaling part first)" >"$out/plan_vs_measured.md"
    finish_part plan "FAIL (no scaling results)"
    return
  fi
  if "$py" "$here/benchlib.py" plan-vs-measured --tandem "$tandem" \
    --results "$out/scaling.json" --compute "$out/compute.json" --links "$out/links.json" \
    --hardware h200-sxm --tolerance "${MG_PLAN_TOL:-0.15}" --strict \
    --out "$out/plan_vs_measured.md" --json "$out/plan_vs_measured.json" \
    --title "tandem plan against the scaling runs" >/dev/null; then
    finish_part plan pass
  else
    finish_part plan "FAIL (off by more than ${MG_PLAN_TOL:-0.15} or no plan)"
  fi
}

start_all=$(date +%s)
for part in $parts; do
  case $part in
    equiv | scaling | overlap | links | plan) "part_$part" ;;
    *)
      echo "multigpu.sh: unknown part '$part' (equiv scaling overlap links plan)" >&2
      exit 2
      ;;
  esac
done

{
  echo "# tandem on $ranks GPU(s) (bench/multigpu.sh)"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit" \
    "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "- machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null |
    sort | uniq -c | sed 's/^ *//' | paste -sd, -) | $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) CPU cores |" \
    "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE | all parts: $(($(date +%s) - start_all)) s"
  echo
  echo "| part | result |"
  echo "|---|---|"
  for i in "${!part_names[@]}"; do echo "| ${part_names[$i]} | ${part_results[$i]} |"; done
  echo
  for f in equivalence.md scaling.md overlap.md links.md plan_vs_measured.md; do
    [[ -f $out/$f ]] && sed 's/^#/##/' "$out/$f" && echo
  done
} >"$out/multigpu.md"
cat "$out/multigpu.md"
((failures == 0))
