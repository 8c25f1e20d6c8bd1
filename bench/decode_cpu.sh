#!/usr/bin/env bash
# CPU decoding with the KV cache against recomputing the whole context for every token,
# in the same run: `tandem generate` and `tandem generate --recompute` continue a 1-token
# prompt to a 256-token context (255 new tokens, greedy, EOS ignored) on a freshly
# initialised model (default gpt2-tiny, whose context is 256), best of BENCH_RUNS runs each.
# Prints decode tokens/s of both, the ratio, and checks that both made the same tokens.
#
#   bench/decode_cpu.sh            (uses $TANDEM_BUILD/tandem, default build/tandem)
# Knobs: BENCH_MODEL (gpt2-tiny), BENCH_TOKENS (255), BENCH_RUNS (3), OMP_NUM_THREADS.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tandem=${TANDEM_BUILD:-$root/build}/tandem
model=${BENCH_MODEL:-gpt2-tiny}
tokens=${BENCH_TOKENS:-255}
runs=${BENCH_RUNS:-3}
dir=$(mktemp -d "${TMPDIR:-/tmp}/tandem-decodebench.XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$tandem" export --model "$model" --format hf --out "$dir/m" >/dev/null
best() {  # the largest decode_tokens_per_s of $runs runs; the ids of the last
  local b=0 j
  for ((i = 0; i < runs; i++)); do
    j=$("$tandem" generate --checkpoint "$dir/m" --prompt-ids 1 --tokens "$tokens" \
      --temperature 0 --ignore-eos --json "$@")
    b=$(python3 -c "import json,sys; print(max($b, json.loads(sys.argv[1])['decode_tokens_per_s']))" "$j")
  done
  echo "$b"
  python3 -c "import json,sys; print(json.loads(sys.argv[1])['ids'])" "$j" >"$dir/ids$#"
}
cached=$(best)
recompute=$(best --recompute)
same=$(cmp -s "$dir/ids0" "$dir/ids1" && echo yes || echo NO)
python3 - "$model" "$tokens" "$cached" "$recompute" "$same" <<'PY'
import sys
model, tokens, c, r, same = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
print(f"| model | context | cached tok/s | recompute tok/s | cached / recompute | same tokens |")
print(f"|---|---:|---:|---:|---:|---|")
print(f"| {model} | {tokens + 1} | {c:,.0f} | {r:,.0f} | {c / r:.1f}x | {same} |")
PY
[[ $same == yes ]]
