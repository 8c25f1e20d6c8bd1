#!/usr/bin/env bash
# Two builds of tandem against each other on one GPU, in the same run: rounds of
# `tandem train` on one model, alternating build A and build B (so drift in clocks or
# temperature falls on both), for the strategies none and full. Prints, per strategy, the
# median tokens/s of each build over all rounds (each round's value is the median of its
# steps after the warm-up) and the ratio B/A; writes the table to OUTDIR/ab.md and every
# number to OUTDIR/ab.json.
#
#   bench/ab_gpu.sh BUILD_A BUILD_B OUTDIR
#
# Use it to check that a change keeps (or gains) speed: A is the build before, B after.
# Environment knobs:
#   AB_MODEL    model preset (default gpt2-124m)
#   AB_BATCH    sequences per step (default 16)
#   AB_SEQ      sequence length (default 1024)
#   AB_STEPS    steps per run (default 15; the first AB_WARMUP are dropped)
#   AB_WARMUP   warm-up steps (default 3)
#   AB_ROUNDS   rounds (default 3)
#   AB_STRATEGIES  (default "none full")
set -uo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 BUILD_A BUILD_B OUTDIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
a=$(cd "$1" && pwd)/tandem
b=$(cd "$2" && pwd)/tandem
mkdir -p "$3/runs"
out=$(cd "$3" && pwd)
model=${AB_MODEL:-gpt2-124m}
batch=${AB_BATCH:-16}
seq=${AB_SEQ:-1024}
steps=${AB_STEPS:-15}
warmup=${AB_WARMUP:-3}
rounds=${AB_ROUNDS:-3}
strategies=${AB_STRATEGIES:-none full}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
for t in "$a" "$b"; do
  [[ -x $t ]] || { echo "ab_gpu.sh: no tandem binary at $t" >&2; exit 2; }
done
((steps > warmup)) || { echo "ab_gpu.sh: AB_STEPS must exceed AB_WARMUP" >&2; exit 2; }

vocab=$(python3 "$here/benchlib.py" vocab "$model") || exit 2
data=$out/random-$vocab.tok
python3 "$here/benchlib.py" tokens --out "$data" --vocab "$vocab" --count $((1 << 21)) >&2

failures=0
for r in $(seq 1 "$rounds"); do
  for strategy in $strategies; do
    for side in A B; do
      bin=$a
      [[ $side == B ]] && bin=$b
      m=$out/runs/$side-$strategy-$r.jsonl
      echo "round $r: $side $strategy" >&2
      if ! timeout --kill-after=15 300 "$bin" train --device cuda --model "$model" \
          --data "$data" --batch "$batch" --global-batch "$batch" --seq "$seq" \
          --steps "$steps" --strategy "$strategy" --lr 3e-4 --progress none \
          --metrics "$m" >"$out/runs/$side-$strategy-$r.log" 2>&1; then
        echo "  failed: see $out/runs/$side-$strategy-$r.log" >&2
        failures=$((failures + 1))
      fi
    done
  done
done

python3 - "$out" "$warmup" "$model" "$batch" "$seq" "$a" "$b" <<'EOF'
import json, pathlib, statistics, sys
out, warmup, model, batch, seq, a, b = sys.argv[1:]
out, warmup = pathlib.Path(out), int(warmup)
runs = {}
for f in sorted((out / "runs").glob("*.jsonl")):
    side, strategy, r = f.stem.split("-")
    tps = [json.loads(l)["tokens_per_s"] for l in f.read_text().splitlines()
           if l.strip() and "tokens_per_s" in json.loads(l)]
    tps = [float(x) for x in tps[warmup:]]
    if tps:
        runs.setdefault(strategy, {}).setdefault(side, []).append(statistics.median(tps))
rows = [f"A/B on one GPU: {model}, batch {batch} x {seq}; A = {a}, B = {b}", "",
        "| strategy | A tokens/s (median of rounds) | B tokens/s | B/A | A rounds | B rounds |",
        "|---|---:|---:|---:|---|---|"]
summary = {}
for strategy, sides in runs.items():
    ma = statistics.median(sides.get("A", [0])) or float("nan")
    mb = statistics.median(sides.get("B", [0])) or float("nan")
    summary[strategy] = dict(A=sides.get("A", []), B=sides.get("B", []), ratio=mb / ma)
    rows.append(f"| {strategy} | {ma:,.0f} | {mb:,.0f} | {mb / ma:.3f} | "
                f"{', '.join(f'{x:,.0f}' for x in sides.get('A', []))} | "
                f"{', '.join(f'{x:,.0f}' for x in sides.get('B', []))} |")
text = "\n".join(rows)
print(text)
(out / "ab.md").write_text(text + "\n")
(out / "ab.json").write_text(json.dumps(summary, indent=1))
EOF
((failures == 0))
