"""Trains a small byte-level GPT on a text file for a few dozen steps, saves it, loads it
back and continues a prompt, all through the tandem Python module.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/train_and_generate.py [TEXT]

TEXT defaults to tandem's README. Under `mpirun -np 2` the same script trains over two ranks
(rank 0 prints and generates).
"""
import pathlib
import sys
import tempfile

import tandem

root = pathlib.Path(__file__).resolve().parents[2]
text = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "README.md"
work = pathlib.Path(tempfile.mkdtemp(prefix="tandem-example-"))

# Token ids of the text, one byte per token (what `tandem data prepare` writes).
tokens = work / "text.tok"
prepared = tandem.prepare_text_files([text], tokens)

config = tandem.TrainConfig(model="gpt2-tiny", data=str(tokens), batch=8, seq=64, steps=60,
                            lr=3e-3, warmup=10, save=str(work / "ckpt"))
trainer = tandem.Trainer(config)


def report(m):
    if trainer.rank == 0 and m["step"] % 10 == 0:
        print(f"step {m['step']:3d}  loss {m['loss']:.3f}  {m['tokens_per_s']:8.0f} tokens/s")


last = trainer.train(callback=report)
if trainer.rank == 0:
    print(f"trained {trainer.steps_done} steps on {prepared['tokens']} tokens; "
          f"final loss {last['loss']:.3f}")
    model = tandem.load(work / "ckpt")
    out = model.generate("The ", max_new_tokens=80, temperature=0.8, top_k=20, seed=3)
    print("sample:", repr("The " + out.text))
