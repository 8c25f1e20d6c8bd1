#!/usr/bin/env bash
# Hugging Face round trip against transformers itself, on a machine that has it (the GPU
# machine; scripts/gpu-check.sh runs it as its `hf` step):
#
#   1. every fixture directory of tests/fixtures/hf is imported and exported again by
#      `tandem export --format hf` (in its own dtype), and transformers' AutoModelForCausalLM
#      loads the export with no missing, unexpected or mismatched tensor and gives the
#      fixture's reference logits (tools/make_hf_fixtures.py --check-load);
#   2. `tandem train --init-from` fine-tunes each fixture for a few steps, the checkpoint is
#      exported, and transformers loads that too;
#   3. with a CUDA build, the same fine-tuning on the GPU follows the CPU's losses within
#      bf16 tolerance.
#
#   scripts/hf-check.sh BUILD_DIR OUTDIR
#
# Exits nonzero when any check fails; OUTDIR gets the exports, logs and hf_check.txt.
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUTDIR" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tandem=$(cd "$1" && pwd)/tandem
mkdir -p "$2"
out=$(cd "$2" && pwd)
fixtures=$root/tests/fixtures/hf
py=${HF_CHECK_PYTHON:-python3}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
failed=0
report=$out/hf_check.txt
: >"$report"

say() { echo "$*" | tee -a "$report"; }

# Random tokens below the fixtures' vocabulary (300) as training data.
"$py" - "$out/data.tok" <<'EOF'
import struct, sys, random
random.seed(7)
ids = [random.randrange(300) for _ in range(20000)]
with open(sys.argv[1], "wb") as f:
    f.write(b"TNDMTOK\0" + struct.pack("<IIQQ", 1, 2, len(ids), 0))
    f.write(struct.pack(f"<{len(ids)}H", *ids))
EOF

dtype_of() {  # the safetensors dtype of a fixture directory's first tensor, as --dtype
  "$py" - "$1" <<'EOF'
import json, struct, sys, glob
path = sorted(glob.glob(sys.argv[1] + "/*.safetensors"))[0]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
dt = next(v["dtype"] for k, v in header.items() if k != "__metadata__")
print({"F32": "f32", "BF16": "bf16", "F16": "f16"}[dt])
EOF
}

gpu=0
if grep -qE "^TANDEM_CUDA:[A-Z]+=(ON|TRUE|1)$" "$1/CMakeCache.txt" 2>/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
fi

for dir in "$fixtures"/*/; do
  name=$(basename "$dir")
  ref=$fixtures/$name.reference.safetensors
  dtype=$(dtype_of "$dir")
  # 1. import then export, loaded by transformers against the reference logits.
  if "$tandem" export --format hf --checkpoint "$dir" --out "$out/export-$name" --dtype "$dtype" \
    >"$out/export-$name.log" 2>&1 &&
    "$py" "$root/tools/make_hf_fixtures.py" --check-load "$out/export-$name" --reference "$ref" \
      >>"$out/export-$name.log" 2>&1; then
    say "PASS export $name ($dtype): $(grep -E 'OK|ok' "$out/export-$name.log" | tail -1)"
  else
    say "FAIL export $name ($dtype): see export-$name.log"
    tail -5 "$out/export-$name.log" | tee -a "$report"
    failed=1
  fi
  # 2. fine-tune from it, export, load in transformers.
  ckpt=$out/ft-$name
  log=$out/ft-$name.log
  if "$tandem" train --init-from "$dir" --data "$out/data.tok" --seq 16 --batch 2 --steps 3 \
    --progress none --save "$ckpt" --metrics "$ckpt.jsonl" >"$log" 2>&1 &&
    "$tandem" export --format hf --checkpoint "$ckpt" --out "$ckpt-hf" >>"$log" 2>&1 &&
    "$py" - "$ckpt-hf" >>"$log" 2>&1 <<'EOF'; then
import sys, torch
from transformers import AutoModelForCausalLM
model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
info = info if isinstance(info, dict) else vars(info)
bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
assert not bad, f"loading info: {bad}"
with torch.no_grad():
    out = model(torch.arange(16).view(1, 16) % 300).logits
assert torch.isfinite(out).all()
print(f"fine-tuned export loads: {type(model).__name__}, logits {tuple(out.shape)} finite")
EOF
    say "PASS fine-tune $name: $(tail -1 "$log")"
  else
    say "FAIL fine-tune $name: see ft-$name.log"
    tail -5 "$log" | tee -a "$report"
    failed=1
  fi
  # 3. the same fine-tuning on the GPU against the CPU's losses.
  if [[ $gpu -eq 1 ]]; then
    glog=$out/ft-$name-cuda.log
    if "$tandem" train --device cuda --init-from "$dir" --data "$out/data.tok" --seq 16 \
      --batch 2 --steps 3 --progress none --metrics "$ckpt-cuda.jsonl" >"$glog" 2>&1 &&
      "$py" - "$ckpt.jsonl" "$ckpt-cuda.jsonl" >>"$glog" 2>&1 <<'EOF'; then
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if l.strip() and "summary" not in l]
cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
rel = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
# bf16 weights and activations: a relative loss gap of a few 2^-8 at most.
assert len(cpu) == len(gpu) == 3 and rel < 16 * 2 ** -8, (cpu, gpu, rel)
print(f"cuda losses {['%.5f' % x for x in gpu]} vs cpu {['%.5f' % x for x in cpu]}: max rel gap {rel:.2e}")
EOF
      say "PASS cuda fine-tune $name: $(tail -1 "$glog")"
    else
      say "FAIL cuda fine-tune $name: see ft-$name-cuda.log"
      tail -5 "$glog" | tee -a "$report"
      failed=1
    fi
  fi
done
if [[ $failed -eq 0 ]]; then say "hf check: PASS"; else say "hf check: FAIL"; fi
exit $failed
