#!/usr/bin/env bash
# Tokenizer throughput: `tandem data prepare --tokenizer` with GPT-2's vocabulary against
# node's gpt-3-encoder (the JavaScript port of GPT-2's own encoder) on the same text in the
# same run. Prints MB/s, MB/s per core and the ratio to node, medians over the runs after a
# warm-up; before timing, checks that both give the same ids on a sample.
#
# Builds nothing: uses $TANDEM_BUILD/tandem (default build/tandem). Needs node, and npm to
# fetch gpt-3-encoder 1.1.4 unless BENCH_NODE_PKG names an unpacked copy (its package/
# folder). Environment knobs:
#   BENCH_MB       size of the text in MB (default 4)
#   BENCH_RUNS     timed runs per row, after one warm-up (default 3)
#   BENCH_OUT      directory for the text and outputs (default: a temporary directory)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TANDEM_BUILD:-$root/build}
tandem=$build/tandem
mb=${BENCH_MB:-4}
runs=${BENCH_RUNS:-3}
vocab=$root/tests/fixtures/tokenizers/gpt2
if [[ ! -x $tandem ]]; then
  echo "tokenize_cpu.sh: no tandem binary at $tandem (build first, or set TANDEM_BUILD)" >&2
  exit 1
fi
if [[ -n ${BENCH_OUT:-} ]]; then
  out=$BENCH_OUT
  mkdir -p "$out"
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/tandem-tokbench.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
pkg=${BENCH_NODE_PKG:-}
if [[ -z $pkg ]]; then
  (cd "$out" && npm pack gpt-3-encoder@1.1.4 --silent >/dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
  pkg=$out/package
fi

# The text: tandem's docs and sources (English prose, code, tables) interleaved with the
# tokenizer fixtures' cases (accents, Greek, Cyrillic, CJK, emoji and ZWJ sequences, runs of
# white space, digits, contractions), in a fixed shuffled order, up to BENCH_MB.
python3 - "$root" "$out/text.txt" "$mb" <<'PY'
import json, pathlib, random, sys
root, path, mb = pathlib.Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
docs = [p.read_text(encoding="utf-8") for p in sorted((root / "docs").glob("*.md"))]
docs += [p.read_text(encoding="utf-8") for p in sorted((root / "src").rglob("*.cpp"))]
cases = [c["text"] for c in json.loads(
    (root / "tests/fixtures/tokenizers/expected_node.json").read_text(encoding="utf-8"))["gpt2"]
    if "text" in c and "<|" not in c["text"]]  # node has no special tokens
rng = random.Random(1234)
parts, size = [], 0
while size < mb * 1e6:
    d = rng.choice(docs)
    i = rng.randrange(len(d))
    part = d[i:i + rng.randrange(200, 4000)] + rng.choice(cases) + "\n"
    parts.append(part)
    size += len(part.encode("utf-8"))
pathlib.Path(path).write_text("".join(parts), encoding="utf-8")
pathlib.Path(path + ".sample").write_text("".join(parts[:12]), encoding="utf-8")
PY

cat >"$out/node_bench.cjs" <<'JS'
// Encodes the file line by line (gpt-3-encoder joins its output arrays by copying, which
// is quadratic in the tokens of one call); prints the time and the token count.
const enc = require(process.argv[2] + '/Encoder.js');
const fs = require('fs');
const text = fs.readFileSync(process.argv[3], 'utf8');
if (process.argv[4] === 'ids') {
  console.log(JSON.stringify(enc.encode(text)));
  process.exit(0);
}
const lines = text.split(/(?<=\n)/);
const t0 = process.hrtime.bigint();
let n = 0;
for (const l of lines) n += enc.encode(l).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(JSON.stringify({seconds: s, tokens: n}));
JS

# Correctness first, apart from timing: the same ids on the sample.
node "$out/node_bench.cjs" "$pkg" "$out/text.txt.sample" ids >"$out/node_ids.json"
"$tandem" tokenize --tokenizer "$vocab" --file "$out/text.txt.sample" --json >"$out/tandem_ids.json"
python3 - "$out" <<'PY'
import json, sys
a = json.load(open(sys.argv[1] + "/node_ids.json"))
b = json.load(open(sys.argv[1] + "/tandem_ids.json"))["ids"]
if a != b:
    sys.exit(f"tokenize_cpu.sh: tandem and gpt-3-encoder differ on the sample ({len(a)} vs {len(b)} ids)")
print(f"check: {len(a)} ids of the sample agree with gpt-3-encoder", file=sys.stderr)
PY

cores=$(nproc)
bytes=$(stat -c %s "$out/text.txt")
: >"$out/times.txt"
for i in $(seq 0 "$runs"); do
  for threads in 1 "$cores"; do
    line=$("$tandem" data prepare --tokenizer "$vocab" --text "$out/text.txt" --out "$out/text.tok" \
      --threads "$threads" --progress none)
    ((i > 0)) && echo "tandem $threads $(sed -E 's/.* ([0-9.]+) MB\/s$/\1/' <<<"$line")" >>"$out/times.txt"
  done
  s=$(node "$out/node_bench.cjs" "$pkg" "$out/text.txt" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
  ((i > 0)) && echo "node 1 $(python3 -c "print($bytes / 1e6 / $s)")" >>"$out/times.txt"
done

python3 - "$out/times.txt" "$bytes" "$cores" "$runs" <<'PY'
import statistics, sys, time, os
rows = {}
for line in open(sys.argv[1]):
    who, threads, mbs = line.split()
    rows.setdefault((who, int(threads)), []).append(float(mbs))
bytes_, cores, runs = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
node = statistics.median(rows[("node", 1)])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"{time.strftime('%Y-%m-%d')} | {cpu}, {cores} cores | {bytes_ / 1e6:.1f} MB of text | "
      f"median of {runs} runs after one warm-up | load {os.getloadavg()[0]:.2f}")
print("| encoder | threads | MB/s | MB/s per core | per core vs node |")
print("|---|---:|---:|---:|---:|")
for (who, threads), v in sorted(rows.items(), key=lambda r: (r[0][0] != "node", r[0][1])):
    m = statistics.median(v)
    name = "node gpt-3-encoder 1.1.4" if who == "node" else "tandem data prepare (GPT-2 BPE)"
    print(f"| {name} | {threads} | {m:.2f} | {m / threads:.2f} | {m / threads / node:.1f}x |")
PY
