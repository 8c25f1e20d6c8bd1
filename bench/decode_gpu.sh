#!/usr/bin/env bash
# Decoding on one GPU: tandem against Hugging Face transformers, eager and with a static
# cache + torch.compile, measured in the same run. For each model shape a directory of
# random bf16 weights is written in the Hugging Face format (so tandem's import is timed
# too); every engine decodes batches of 1, 8 and 32 random 128-token prompts for 256 new
# tokens (greedy, EOS ignored). The device-to-device copy bandwidth and the bf16 GEMM
# ceiling are measured in the same run; the memory floor of a decode step is (weight bytes
# read + KV cache bytes read) / copy bandwidth. A prefill of 2048 tokens is set against the
# GEMM ceiling. Prints a Markdown table and writes OUTDIR/results.md and results.jsonl.
#
#   bench/decode_gpu.sh BUILD_DIR OUTDIR
#
# Environment knobs:
#   BENCH_MODELS    shapes, in order (default "llama2-7b llama3-8b gpt2-1.5b")
#   BENCH_BATCHES   (default "1,8,32");  BENCH_PROMPT (128);  BENCH_NEW (256)
#   BENCH_REF_BATCHES  batches the references run (default: BENCH_BATCHES)
#   BENCH_COMPILE   shapes that also run torch.compile (default "llama2-7b"; "" for none)
#   BENCH_EAGER=0   skip transformers eager;  BENCH_PREFILL=0  skip the 2048-token prefill
#   BENCH_MODEL_DIR where the weight directories go (default /tmp/tandem-decode-models; a
#                   directory already there is reused)
#   BENCH_TIMEOUT   seconds per run (default 420)
set -uo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUTDIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "$1" && pwd)
mkdir -p "$2/logs"
out=$(cd "$2" && pwd)
models=${BENCH_MODELS:-llama2-7b llama3-8b gpt2-1.5b}
batches=${BENCH_BATCHES:-1,8,32}
prompt=${BENCH_PROMPT:-128}
new=${BENCH_NEW:-256}
compile=${BENCH_COMPILE-llama2-7b}
mdir=${BENCH_MODEL_DIR:-/tmp/tandem-decode-models}
tmo=${BENCH_TIMEOUT:-420}
py=python3
results=$out/results.jsonl
: >"$results"
status=0

run() {  # name, then the command; its JSON lines go to results.jsonl
  local name=$1
  shift
  echo "== $name" >&2
  if timeout "$tmo" "$@" >"$out/logs/$name.out" 2>"$out/logs/$name.err"; then
    grep '^{' "$out/logs/$name.out" >>"$results"
  else
    echo "   failed (exit $?): see logs/$name.err" >&2
    tail -3 "$out/logs/$name.err" >&2
    echo "{\"what\": \"failed\", \"run\": \"$name\"}" >>"$results"
    status=1
  fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
run ceilings $py "$here/decode_ref.py" ceilings
for m in $models; do
  d=$mdir/$m
  if [[ ! -f $d/config.json ]]; then
    mkdir -p "$d"
    run "make-$m" $py "$here/decode_ref.py" make --shape "$m" --out "$d"
  fi
  run "tandem-$m" "$build/tandem_decode_bench" "$d" --batches "$batches" --prompt "$prompt" \
    --new "$new"
  ref_batches=${BENCH_REF_BATCHES:-$batches}
  for b in ${ref_batches//,/ }; do
    [[ ${BENCH_EAGER:-1} == 1 ]] &&
      run "eager-$m-b$b" $py "$here/decode_ref.py" hf --model "$d" --batch "$b" \
        --prompt "$prompt" --new "$new" --mode eager
    [[ " $compile " == *" $m "* ]] &&
      run "compile-$m-b$b" $py "$here/decode_ref.py" hf --model "$d" --batch "$b" \
        --prompt "$prompt" --new "$new" --mode compile
  done
  if [[ ${BENCH_PREFILL:-1} == 1 && $m == llama2-7b ]]; then
    run "prefill-$m" "$build/tandem_decode_bench" "$d" --batches 1 --prompt 2048 --new 2 \
      --repeat 3
  fi
done
$py "$here/decode_table.py" "$results" "$mdir" | tee "$out/results.md"
exit $status
