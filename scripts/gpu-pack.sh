#!/usr/bin/env bash
# Packs what a GPU check wrote into a few files, for machines that hand back only a handful
# of files from a run (the device tool returns at most 8, each at most 16 MiB):
#
#   scripts/gpu-pack.sh SRC OUT [LOG]
#
# SRC is the OUTDIR of scripts/gpu-check.sh (or of bench/train_gpu.sh, or of
# scripts/decode-check.sh); LOG is the console log of that run, if it was kept. OUT receives
# at most eight files:
#   summary.txt    SRC/summary.txt, the step table (when there is one)
#   console.log    the last 400 lines of LOG
#   tests.log      the failing and skipped GPU tests with their output, and the totals
#   results.md     every results.md under SRC (the benchmark tables), one after another
#   kernels.md     every kernels-*.md under SRC (BENCH_KERNELS=1), one after another
#   plan.md        plan_vs_measured.md, when the planner step ran
#   rest.tar.gz    everything else under SRC that is smaller than 8 MiB a file, while the
#                  archive stays under 15 MiB
#   rest.txt       the files left out of the archive, if any
set -uo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 SRC OUT [LOG]" >&2
  exit 2
fi
src=$1
out=$2
log=${3:-}
if [[ ! -d $src ]]; then
  echo "gpu-pack.sh: no folder $src" >&2
  exit 2
fi
mkdir -p "$out"

[[ -f $src/summary.txt ]] && cp "$src/summary.txt" "$out/summary.txt"
[[ -n $log && -f $log ]] && tail -n 400 "$log" >"$out/console.log"

if [[ -f $src/gpu_tests.log ]]; then
  # gtest's own summary lines, then the output of every failing test.
  {
    grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]|^\[==========\]' "$src/gpu_tests.log" | tail -n 60
    awk '/^\[ RUN      \]/ {buf = $0 "\n"; next}
         {buf = buf $0 "\n"}
         /^\[  FAILED  \] .*\(/ {printf "%s", buf; buf = ""}' "$src/gpu_tests.log" | head -c 4000000
  } >"$out/tests.log"
fi

concat() {  # NAME PATTERN: every file under SRC matching PATTERN, with its path as a title
  local name=$1 pattern=$2 f found=0
  while IFS= read -r f; do
    printf '<!-- %s -->\n' "${f#"$src"/}"
    cat "$f"
    printf '\n'
    found=1
  done < <(find "$src" -name "$pattern" -type f | sort) >"$out/$name"
  ((found)) || rm -f "$out/$name"
}
concat results.md results.md
concat kernels.md 'kernels-*.md'
concat plan.md plan_vs_measured.md

# The rest, file by file while the archive stays small.
list=$(mktemp)
: >"$out/rest.txt"
while IFS= read -r f; do
  size=$(stat -c %s "$f")
  if ((size < 8 << 20)); then
    echo "${f#"$src"/}" >>"$list"
  else
    echo "${f#"$src"/} ($size bytes, left out)" >>"$out/rest.txt"
  fi
done < <(find "$src" -type f | sort)
tar czf "$out/rest.tar.gz" -C "$src" -T "$list" 2>/dev/null
if (($(stat -c %s "$out/rest.tar.gz") >= 15 << 20)); then
  # Too large: keep the logs and JSON files only.
  grep -E '\.(log|json|jsonl|md|txt|xml|tsv)$' "$list" >"$list.small"
  tar czf "$out/rest.tar.gz" -C "$src" -T "$list.small" 2>/dev/null
  echo "(archive reduced to logs and tables)" >>"$out/rest.txt"
  rm -f "$list.small"
fi
rm -f "$list"
[[ -s $out/rest.txt ]] || rm -f "$out/rest.txt"
ls -l "$out"
