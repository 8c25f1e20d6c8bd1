#!/usr/bin/env python3
"""Writes the seed corpora of tandem's fuzz harnesses and the checkpoints two of them use.

    tests/fuzz/make_corpus.py TANDEM_BINARY

Valid seeds come from tandem's own writers wherever tandem writes the format (`tandem data
prepare`, `tandem train --save`, `tandem export`, and the run and model configs a
checkpoint index records); formats tandem only reads (llm.c token files, probe files, the
32-bit token width) are written here by hand from docs/formats.md and docs/planner.md.
Each valid seed gets a few slightly broken neighbours, and every input that once crashed a
harness is kept as a regression seed (named regress-*). Replaces corpus/<harness>/seed-*
and checkpoints/; the regression seeds and what the fuzzer added are left alone.
Python 3 standard library only.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
CHECKPOINTS = os.path.join(HERE, "checkpoints")

# The smallest model worth a checkpoint: one block of 4 channels over the 16 byte values
# 0-15 (the training text below uses no others), so a shard file is a few KB and the
# checkpoint harnesses run fast.
TINY = {"name": "fuzz-tiny", "family": "gpt2", "vocab": 16, "vocab_padded": 16, "context": 8,
        "d_model": 4,
        "n_layer": 1, "n_head": 1, "d_ff": 8}


def run(*args):
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.DEVNULL)


def seeds(harness):
    """The seed folder of a harness, emptied of earlier seed-* files."""
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed-"):
            os.remove(os.path.join(d, f))
    return d


def put(folder, name, data):
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, "seed-" + name), "wb") as f:
        f.write(data)


def dup_key(text, key):
    """JSON text with the first '"key": value' pair of text repeated right after itself."""
    i = text.index('"%s":' % key)
    j = i
    depth = 0
    while True:  # the end of the value: a comma or closing bracket at depth 0
        c = text[j]
        if c in "[{":
            depth += 1
        elif c in "]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        j += 1
    pair = text[i:j]
    return text[:j] + ", " + pair + text[j:]


def tokens(tmp, tandem):
    d = seeds("tokens")
    text = os.path.join(tmp, "text.txt")
    with open(text, "wb") as f:
        f.write(bytes(range(16)) * 4)
    tok = os.path.join(tmp, "text.tok")
    run(tandem, "data", "prepare", "--text", text, "--out", tok)
    good = open(tok, "rb").read()
    put(d, "tandem-u16.tok", good)
    put(d, "tandem-u16-truncated.tok", good[:-3])
    put(d, "tandem-u16-trailing.tok", good + b"\0")
    put(d, "tandem-u16-count-huge.tok", good[:16] + struct.pack("<Q", 2**63) + good[24:])
    put(d, "tandem-u16-version2.tok", good[:8] + struct.pack("<I", 2) + good[12:])
    put(d, "tandem-u16-reserved.tok", good[:24] + struct.pack("<Q", 1) + good[32:])
    header = b"TNDMTOK\0" + struct.pack("<IIQQ", 1, 4, 3, 0)
    put(d, "tandem-u32.tok", header + struct.pack("<III", 7, 70000, 2**32 - 1))
    put(d, "tandem-width3.tok", b"TNDMTOK\0" + struct.pack("<IIQQ", 1, 3, 1, 0) + b"abc")
    put(d, "tandem-header-only.tok", b"TNDMTOK\0" + struct.pack("<IIQQ", 1, 2, 0, 0))
    llmc = struct.pack("<256i", *([20240520, 1, 5] + [0] * 253))
    put(d, "llmc.bin", llmc + struct.pack("<5H", 50256, 464, 3290, 318, 11))
    put(d, "llmc-negative-count.bin", llmc[:8] + struct.pack("<i", -5) + llmc[12:])
    put(d, "llmc-version2.bin", llmc[:4] + struct.pack("<i", 2) + llmc[8:] + b"\0" * 10)
    put(d, "llmc-short-header.bin", llmc[:100])
    put(d, "unknown-magic.tok", b"NOTATOKENFILE")
    return tok


def model_configs():
    d = seeds("model_config")
    put(d, "tiny.json", json.dumps(TINY))
    put(d, "preset-llama.json", json.dumps({"preset": "llama-tiny", "n_layer": 1}))
    put(d, "neox.json", json.dumps({"family": "neox", "vocab": 64, "d_model": 16, "n_head": 2,
                                    "d_ff": 32, "n_layer": 2, "rotary_pct": 0.5}))
    put(d, "llama-gqa.json", json.dumps({"family": "llama", "vocab": 300, "d_model": 32,
                                         "n_head": 4, "n_kv_head": 2, "d_ff": 40,
                                         "rope_theta": 500000.0, "norm_eps": 1e-6}))
    put(d, "duplicate-key.json", dup_key(json.dumps(TINY), "n_layer"))
    put(d, "unknown-key.json", json.dumps(dict(TINY, colour="blue")))
    put(d, "bad-family.json", json.dumps(dict(TINY, family="rnn")))
    put(d, "not-object.json", "[1, 2, 3]")


def train(tmp, tandem, tok, ranks, out):
    model = os.path.join(tmp, "tiny.json")
    with open(model, "w") as f:
        json.dump(TINY, f)
    args = [tandem, "train", "--model", model, "--data", tok, "--batch", "2", "--seq", "4",
            "--steps", "2", "--progress", "none", "--save", out]
    if ranks > 1:
        args += ["--ranks", str(ranks), "--strategy", "full"]
    run(*args)


def checkpoints(tmp, tandem, tok):
    shutil.rmtree(CHECKPOINTS, ignore_errors=True)
    one = os.path.join(CHECKPOINTS, "one-shard")
    two = os.path.join(CHECKPOINTS, "two-shards")
    train(tmp, tandem, tok, 1, one)
    train(tmp, tandem, tok, 2, two)

    d = seeds("checkpoint_index")
    for name, ckpt in (("one-shard", one), ("two-shards", two)):
        text = open(os.path.join(ckpt, "index.json")).read()
        put(d, name + ".json", text)
    index = json.load(open(os.path.join(one, "index.json")))
    compact = json.dumps(index)
    put(d, "duplicate-key.json", dup_key(compact, "step"))
    put(d, "duplicate-model-key.json", dup_key(compact, "d_model"))
    for key, value in (("step", 1e300), ("world_size", 2**40), ("align", 2**62),
                       ("shard_size", 0), ("version", "2")):
        put(d, "bad-%s.json" % key.replace("_", "-"), json.dumps(dict(index, **{key: value})))
    huge = json.loads(compact)
    huge["model"]["n_layer"] = 2**31 - 1
    put(d, "model-larger-than-files.json", json.dumps(huge))

    d = seeds("checkpoint_shard")
    shard = [f for f in os.listdir(one) if f.startswith("step-")][0]
    data = open(os.path.join(one, shard), "rb").read()
    put(d, "shard.bin", data)
    put(d, "bad-magic.bin", b"X" + data[1:])
    put(d, "bad-rank.bin", data[:12] + struct.pack("<I", 1) + data[16:])
    put(d, "bad-floats.bin", data[:24] + struct.pack("<Q", 2**61) + data[32:])
    put(d, "truncated.bin", data[:-4])
    return one, index


def run_configs(index):
    d = seeds("run_config")
    options = index["train"]
    put(d, "recorded.json", json.dumps(options, indent=2))
    put(d, "small.json", json.dumps({"model": "gpt2-tiny", "batch": 8, "seq": 128, "lr": 2e-3,
                                     "strategy": "hybrid", "shard-group": 2,
                                     "mem-limit": "8GiB", "trace-steps": "2:4"}))
    put(d, "duplicate-key.json", dup_key(json.dumps(options), "lr"))
    put(d, "bad-enum.json", json.dumps({"strategy": "zero4"}))
    put(d, "lr-too-large.json", json.dumps({"lr": 1e300}))
    put(d, "batch-out-of-range.json", json.dumps({"batch": 2**40}))
    put(d, "mem-limit-junk.json", json.dumps({"mem-limit": "12 parsecs"}))
    put(d, "unknown-key.json", json.dumps({"colour": "blue"}))


def safetensors(tmp, tandem, ckpt):
    d = seeds("safetensors")
    out = os.path.join(tmp, "model.safetensors")
    run(tandem, "export", "--checkpoint", ckpt, "--out", out)
    data = open(out, "rb").read()
    put(d, "export.safetensors", data)
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]

    def file_of(h, extra=b""):
        text = h if isinstance(h, str) else json.dumps(h)
        text += " " * ((8 - len(text) % 8) % 8)
        return struct.pack("<Q", len(text)) + text.encode() + body + extra

    first = [k for k in header if k != "__metadata__"][0]
    put(d, "duplicate-tensor.safetensors", file_of(dup_key(json.dumps(header), first)))
    h = json.loads(json.dumps(header))
    h[first]["data_offsets"] = [0, 2**63]
    put(d, "offsets-past-end.safetensors", file_of(h))
    h = json.loads(json.dumps(header))
    h[first]["shape"] = [2**62, 2**62]
    put(d, "shape-overflow.safetensors", file_of(h))
    put(d, "trailing-bytes.safetensors", file_of(header, b"\0" * 4))
    put(d, "length-past-end.safetensors", struct.pack("<Q", 2**63) + data[8:])
    put(d, "truncated.safetensors", data[:len(data) // 2])


def probe_files():
    d = seeds("probe_file")
    put(d, "compute-cpu.json", json.dumps({"device": "cpu", "tflops_f32": 0.08,
                                           "tflops_bf16": None, "copy_GBps": 9.5,
                                           "mem_GiB": 8}))
    put(d, "compute-cuda.json", json.dumps({"device": "cuda", "tflops_f32": 51.0,
                                            "tflops_bf16": 700.0, "copy_GBps": 4000,
                                            "mem_GiB": 139.8}))
    sweep = [{"bytes": 2**k, "time_us": 5 + 2**k / 1e4, "busbw_GBps": 1.0, "wrong": 0}
             for k in range(10, 24, 4)]
    links = {"ranks": 2, "sizes": [2**k for k in range(10, 24, 4)], "all_gather": sweep,
             "reduce_scatter": sweep, "all_reduce": sweep}
    put(d, "links.json", json.dumps(links))
    put(d, "links-duplicate-key.json", dup_key(json.dumps(links), "ranks"))
    put(d, "links-ranks-huge.json", json.dumps(dict(links, ranks=2**32 + 2)))
    put(d, "links-wrong-values.json",
        json.dumps(dict(links, all_reduce=[dict(sweep[0], wrong=3)])))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tandem = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        tok = tokens(tmp, tandem)
        model_configs()
        ckpt, index = checkpoints(tmp, tandem, tok)
        run_configs(index)
        safetensors(tmp, tandem, ckpt)
        probe_files()
    total = sum(os.path.getsize(os.path.join(r, f)) for top in (CORPUS, CHECKPOINTS)
                for r, _, fs in os.walk(top) for f in fs)
    print("corpus and checkpoints: %d bytes" % total)


if __name__ == "__main__":
    main()
