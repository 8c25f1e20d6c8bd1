#!/usr/bin/env bash
# The default job: builds a byte-level corpus from tandem's own docs and sources, trains a
# small GPT on it with full sharding over 2 local CPU ranks for a minute or two (showing
# how much communication each step exposed), writes metrics and a checkpoint, and prints
# a sample. Everything lands in build/demo (or $TANDEM_BUILD/demo).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TANDEM_BUILD:-$root/build}
out=$build/demo
steps=${TANDEM_DEMO_STEPS:-300}

"$root/scripts/install-deps.sh"
TANDEM_TARGET=tandem "$root/scripts/build.sh"
tandem=$build/tandem
mkdir -p "$out"

cd "$root"
mapfile -t files < <(find README.md docs src -type f \( -name '*.md' -o -name '*.h' -o -name '*.cpp' \) | sort)
"$tandem" data prepare --text "${files[@]}" --out "$out/corpus.tok"

echo "training gpt2-tiny on 2 ranks, fully sharded, for $steps steps"
echo "(a uniform guess over 256 bytes costs ln 256 = 5.55 nats per byte)"
start=$(date +%s)
"$tandem" train --ranks 2 --strategy full --model gpt2-tiny --data "$out/corpus.tok" \
  --batch 8 --seq 128 --steps "$steps" --lr 2e-3 --warmup 20 --log-every 25 \
  --metrics "$out/metrics.jsonl" --save "$out/checkpoint"
echo "trained in $(( $(date +%s) - start )) s; metrics in $out/metrics.jsonl, checkpoint in $out/checkpoint"

echo "--- sample ---"
"$tandem" generate --checkpoint "$out/checkpoint" --prompt "// The " --tokens 400 \
  --temperature 0.8 --top-k 40 --seed 7
