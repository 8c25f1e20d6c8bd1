#!/usr/bin/env bash
# Sharded decoding: every inference layout at 1..N ranks, the planner's prediction beside
# each measured row (`tandem generate --ranks N --strategy S --json` prints both). Greedy,
# EOS ignored, one prompt of BENCH_PROMPT random ids copied to each of the BENCH_BATCHES
# sequences, BENCH_NEW new tokens.
#
#   bench/decode_multi.sh gpu [MAX_RANKS]   Llama-2-7B shape (random bf16 weights written as
#                                           a Hugging Face directory by decode_ref.py), one GPU
#                                           per rank, NCCL_NVLS_ENABLE=0; MAX_RANKS defaults
#                                           to the GPUs visible
#   bench/decode_multi.sh cpu [MAX_RANKS]   CPU ranks (default 2) on BENCH_CPU_MODEL (a preset
#                                           or JSON config; default a 4-block Llama of width
#                                           512), exported as a Hugging Face directory
#
# The prediction is the planner's on BENCH_HARDWARE (default h200-sxm, or cpu-local on the CPU,
# whose rates each run measures first).
# Knobs: BENCH_STRATEGIES ("replicate fsdp tp pipeline"), BENCH_BATCHES ("1 8"), BENCH_PROMPT (128;
# 16 on CPU), BENCH_NEW (256; 64 on CPU), BENCH_MODEL_DIR (where the GPU weights go, default
# /tmp/tandem-decode-models; reused when there), TANDEM_BUILD (default build), OUT (a
# directory for results.jsonl and results.md, default a temporary one).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-}
if [[ $mode != gpu && $mode != cpu ]]; then
  echo "usage: $0 gpu|cpu [MAX_RANKS]" >&2
  exit 2
fi
tandem=${TANDEM_BUILD:-$root/build}/tandem
out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/tandem-decodemulti.XXXXXX")}
mkdir -p "$out/logs"
results=$out/results.jsonl
: >"$results"
strategies=${BENCH_STRATEGIES:-replicate fsdp tp pipeline}
batches=${BENCH_BATCHES:-1 8}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if [[ $mode == gpu ]]; then
  max=${2:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  prompt=${BENCH_PROMPT:-128}
  new=${BENCH_NEW:-256}
  dir=${BENCH_MODEL_DIR:-/tmp/tandem-decode-models}/llama2-7b
  if [[ ! -f $dir/config.json ]]; then
    mkdir -p "$dir"
    python3 "$root/bench/decode_ref.py" make --shape llama2-7b --out "$dir" || exit 1
  fi
  device=cuda
  model=llama2-7b
  hardware=${BENCH_HARDWARE:-h200-sxm}
else
  max=${2:-2}
  prompt=${BENCH_PROMPT:-16}
  new=${BENCH_NEW:-64}
  # A step that reads ~70 MB of fp32 weights (as DistPrediction.GenerateRateWithinAFifth), so
  # that the weights and not each op's overhead set the rate.
  if [[ -z ${BENCH_CPU_MODEL:-} ]]; then
    echo '{"preset": "llama-tiny", "name": "bench-llama-512", "d_model": 512, "n_layer": 4,
      "n_head": 8, "n_kv_head": 8, "d_ff": 1536, "vocab": 8000, "vocab_padded": 8192,
      "context": 256}' >"$out/model.json"
  fi
  model=${BENCH_CPU_MODEL:-$out/model.json}
  dir=$out/model
  "$tandem" export --model "$model" --format hf --out "$dir" >/dev/null || exit 1
  device=cpu
  hardware=${BENCH_HARDWARE:-cpu-local}
fi
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 256)) for _ in range($prompt)))")
status=0
for ((n = 1; n <= max; n++)); do
  for s in $strategies; do
    for b in $batches; do
      name="$s-n$n-b$b"
      echo "== $name" >&2
      if "$tandem" generate --checkpoint "$dir" --device "$device" --ranks "$n" --strategy "$s" \
        --hardware "$hardware" --calibrate-after 0 --prompt-ids "$ids" --batch "$b" --tokens "$new" --temperature 0 --ignore-eos --json \
        >"$out/logs/$name.out" 2>"$out/logs/$name.err"; then
        python3 -c "
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(json.dumps(dict(strategy=j['strategy'], ranks=j['ranks'], batch=j['batch'],
      decode_tokens_per_s=j['decode_tokens_per_s'],
      predicted=j.get('predicted_decode_tokens_per_s'),
      time_to_first_token_ms=j['time_to_first_token_ms'], mem=j['peak_mem_bytes'])))" \
          "$out/logs/$name.out" >>"$results"
      else
        echo "   failed or refused: $(tail -1 "$out/logs/$name.err")" >&2
        echo "{\"strategy\": \"$s\", \"ranks\": $n, \"batch\": $b, \"refused\": $(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$(tail -1 "$out/logs/$name.err")")}" >>"$results"
      fi
    done
  done
done
python3 - "$results" "$model" "$device" >"$out/results.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{sys.argv[2]} on {sys.argv[3]}: decode tokens/s, measured and predicted by the planner\n")
print("| strategy | ranks | batch | tok/s | predicted | off | TTFT ms | memory GiB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    if "refused" in r:
        print(f"| {r['strategy']} | {r['ranks']} | {r['batch']} | refused: {r['refused'][:60]} | | | | |")
        continue
    p = r.get("predicted")
    off = f"{100 * (r['decode_tokens_per_s'] / p - 1):+.0f}%" if p else "—"
    print(f"| {r['strategy']} | {r['ranks']} | {r['batch']} | {r['decode_tokens_per_s']:,.1f} | "
          f"{p and f'{p:,.1f}' or '—'} | {off} | {r['time_to_first_token_ms']:.1f} | {r['mem'] / 2**30:.2f} |")
PY
cat "$out/results.md"
exit $status
