#!/usr/bin/env bash
# CPU training throughput and communication overlap of tandem over MPI ranks: trains a
# ~3M-parameter byte-level GPT on tandem's own docs and sources at 1, 2 and 4 ranks with
# every strategy, and prints one table row per run (medians over the steps after warm-up).
#
# Builds nothing: uses $TANDEM_BUILD/tandem (default build/tandem). Environment knobs:
#   TANDEM_BUILD    build directory holding the tandem binary (default: <repo>/build)
#   BENCH_STEPS     optimizer steps per run (default 10; the first BENCH_WARMUP are dropped)
#   BENCH_WARMUP    warm-up steps left out of the medians (default 2)
#   BENCH_SEQ       sequence length (default 128)
#   BENCH_BATCH     global batch in sequences, the same at every rank count (default 8)
#   BENCH_RANKS     rank counts to run (default "1 2 4")
#   BENCH_OUT       directory for the corpus, model config and metrics (default: a temp dir)
#   BENCH_THREADS   OpenMP/OpenBLAS threads per rank (default: max(1, cores / ranks), what
#                   `tandem train --ranks` sets; one rank then uses every core)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TANDEM_BUILD:-$root/build}
tandem=$build/tandem
steps=${BENCH_STEPS:-10}
warmup=${BENCH_WARMUP:-2}
seq=${BENCH_SEQ:-128}
global_batch=${BENCH_BATCH:-8}
rank_counts=${BENCH_RANKS:-1 2 4}
python=/usr/bin/python3

if [[ ! -x $tandem ]]; then
  echo "train_cpu.sh: no tandem binary at $tandem (build first: scripts/build.sh, or set TANDEM_BUILD)" >&2
  exit 1
fi
if ((steps <= warmup)); then
  echo "train_cpu.sh: BENCH_STEPS ($steps) must exceed BENCH_WARMUP ($warmup)" >&2
  exit 1
fi
if [[ -n ${BENCH_OUT:-} ]]; then
  out=$BENCH_OUT
  mkdir -p "$out"
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/tandem-bench.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
cores=$(nproc)

# Corpus: every doc and source file of the repository, byte-level.
mapfile -t texts < <(cd "$root" && find README.md docs src -type f \
  \( -name '*.md' -o -name '*.h' -o -name '*.cpp' -o -name '*.cu' \) | sort)
(cd "$root" && "$tandem" data prepare --text "${texts[@]}" --out "$out/corpus.tok") >/dev/null

# ~3.2M parameters: gpt2-tiny twice as wide.
cat >"$out/model.json" <<EOF
{ "preset": "gpt2-tiny", "name": "bench-3m", "d_model": 256, "n_layer": 4, "n_head": 4,
  "d_ff": 1024, "context": $seq }
EOF

runs=()
for ranks in $rank_counts; do
  for strategy in full grad-op none; do runs+=("$ranks $strategy"); done
  if ((ranks == 4)); then runs+=("4 hybrid"); fi
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)
for run in "${runs[@]}"; do
  read -r ranks strategy <<<"$run"
  if ((global_batch % ranks != 0)); then
    echo "skip: global batch $global_batch does not split over $ranks ranks" >&2
    continue
  fi
  metrics="$out/metrics-$ranks-$strategy.jsonl"
  args=(train --model "$out/model.json" --data "$out/corpus.tok" --seq "$seq"
    --batch $((global_batch / ranks)) --global-batch "$global_batch" --steps "$steps"
    --lr 1e-3 --progress none --strategy "$strategy" --metrics "$metrics")
  if ((ranks > 1)); then args+=(--ranks "$ranks"); fi
  if [[ $strategy == hybrid ]]; then args+=(--shard-group 2); fi
  threads=${BENCH_THREADS:-$((cores / ranks))}
  ((threads >= 1)) || threads=1
  echo "run: OMP_NUM_THREADS=$threads tandem ${args[*]}" >&2
  OMP_NUM_THREADS=$threads "$tandem" "${args[@]}" >/dev/null
done
elapsed=$(($(date +%s) - start))
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | machine: $cores cores ($cpu) | load average" \
  "before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg) | all runs: $elapsed s"

"$python" - "$out" "$warmup" "$global_batch" "$seq" "$steps" "${runs[@]}" <<'EOF'
import json, statistics, sys

out, warmup, batch, seq, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
print(f"model bench-3m (gpt2, d_model 256, 4 layers); global batch {batch} x seq {seq}; "
      f"{steps} steps per run, medians over steps {warmup + 1}..{steps}")
header = ["ranks", "strategy", "step ms", "tokens/s", "compute ms", "comm ms",
          "exposed comm ms", "exposed/step", "peak MiB/rank"]
rows = []
for run in sys.argv[6:]:
    ranks, strategy = run.split()
    try:
        with open(f"{out}/metrics-{ranks}-{strategy}.jsonl") as f:
            # Per-step lines only: the run's last line is its summary.
            lines = [m for m in (json.loads(l) for l in f if l.strip())
                     if "summary" not in m][warmup:]
    except FileNotFoundError:
        continue
    med = lambda k: statistics.median(m[k] for m in lines)
    share = statistics.median(m["exposed_comm_ms"] / m["step_ms"] for m in lines)
    rows.append([ranks, strategy, f"{med('step_ms'):.1f}", f"{med('tokens_per_s'):.0f}",
                 f"{med('compute_ms'):.1f}", f"{med('comm_ms'):.1f}",
                 f"{med('exposed_comm_ms'):.1f}", f"{100 * share:.1f}%",
                 f"{max(m['peak_mem_bytes'] for m in lines) / 2**20:.1f}"])
print("| " + " | ".join(header) + " |")
print("|" + "|".join("---:" if i != 1 else "---" for i in range(len(header))) + "|")
for r in rows:
    print("| " + " | ".join(r) + " |")
EOF
