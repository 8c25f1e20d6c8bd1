#!/usr/bin/env python3
"""Greedy generation references for tandem's decoding tests.

For each tiny Hugging Face fixture under tests/fixtures/hf (made by make_hf_fixtures.py) this
script loads the directory with transformers' AutoModelForCausalLM in float64 and runs
model.generate(do_sample=False) for 40 new tokens on two prompts of different lengths (ids
from numpy.random.RandomState(1234), above the special ids 0..2), with the end-of-sequence
token disabled so every run makes 40 tokens. For every new token it also records the gap
between the largest and the second largest logit (output_scores), so a test can tell a
decision that precision could flip from one it could not. It writes
OUT/<name>.generate.json:

    {"transformers": "5.17.0", "torch": "...", "max_new_tokens": 40,
     "runs": [{"prompt": [...], "ids": [...40 new ids...], "margins": [...40 floats...],
               "top": [...40 largest logits...]}, ...]}

Run (PyTorch 2.x, transformers 4.4x or 5.x, no network):

    python3 tools/make_generate_fixtures.py --fixtures tests/fixtures/hf
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

NAMES = ["gpt2", "llama", "llama-tied-bf16-sharded", "neox", "neox-fp16"]
PROMPT_LENGTHS = [5, 11]
NEW_TOKENS = 40


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", required=True, help="the directory holding the fixtures")
    ap.add_argument("--out", help="where to write the references (default: --fixtures)")
    args = ap.parse_args()
    out = args.out or args.fixtures
    import transformers
    from transformers import AutoModelForCausalLM

    new = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56)
    kw = {"dtype" if new else "torch_dtype": torch.float64}
    for name in NAMES:
        path = os.path.join(args.fixtures, name)
        model = AutoModelForCausalLM.from_pretrained(path, **kw).eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        vocab = model.config.vocab_size
        rng = np.random.RandomState(1234)
        runs = []
        for n in PROMPT_LENGTHS:
            prompt = [int(x) for x in rng.randint(3, vocab, n)]
            with torch.no_grad():
                g = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                                   do_sample=False,
                                   output_scores=True, return_dict_in_generate=True)
            ids = [int(x) for x in g.sequences[0, n:]]
            assert len(ids) == NEW_TOKENS, (name, len(ids))
            margins, top = [], []
            for s in g.scores:
                v = torch.topk(s[0].double(), 2).values
                margins.append(float(v[0] - v[1]))
                top.append(float(v[0]))
            runs.append({"prompt": prompt, "ids": ids, "margins": margins, "top": top})
        doc = {"transformers": transformers.__version__, "torch": torch.__version__,
               "max_new_tokens": NEW_TOKENS, "dtype": "float64", "runs": runs}
        with open(os.path.join(out, f"{name}.generate.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"{name}: {[r['ids'][:8] for r in runs]} min margin "
              f"{min(min(r['margins']) for r in runs):.3g}", file=sys.stderr)


if __name__ == "__main__":
    main()
