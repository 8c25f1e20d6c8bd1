#!/usr/bin/env python3
"""The references and helpers of bench/decode_gpu.sh (one JSON line per measurement).

    decode_ref.py make --shape llama2-7b|llama3-8b|gpt2-1.5b --out DIR
        a Hugging Face directory of random bf16 weights (N(0, 0.02)) of that shape
    decode_ref.py ceilings
        device-to-device copy bandwidth (bytes read + written / s) and an 8192^3 bf16
        matrix product's TFLOP/s, measured now
    decode_ref.py hf --model DIR --batch B --prompt P --new N --mode eager|compile
        transformers' generate (greedy, N new tokens, EOS ignored) on B random prompts of P
        tokens: time to first token and decode tokens/s. compile: a static cache, with
        which generate compiles the forward (torch.compile, mode="reduce-overhead"), as
        transformers documents; the compile time is reported apart and not measured, and
        compiled_graphs counts what torch.compile compiled (0: it did not run).
"""
import argparse
import json
import sys
import time

import torch

SHAPES = {
    "llama2-7b": dict(arch="llama", vocab=32000, d=4096, layers=32, heads=32, kv=32, ffn=11008,
                      theta=10000.0, ctx=4096),
    "llama3-8b": dict(arch="llama", vocab=128256, d=4096, layers=32, heads=32, kv=8, ffn=14336,
                      theta=500000.0, ctx=8192),
    "gpt2-1.5b": dict(arch="gpt2", vocab=50257, d=1600, layers=48, heads=25, kv=25, ffn=6400,
                      theta=0.0, ctx=1024),
}


def emit(**kw):
    print(json.dumps(kw), flush=True)


def make(args):
    import transformers
    s = SHAPES[args.shape]
    if s["arch"] == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=s["vocab"], hidden_size=s["d"], intermediate_size=s["ffn"],
            num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
            num_key_value_heads=s["kv"], max_position_embeddings=s["ctx"], rope_theta=s["theta"],
            rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
        cls = transformers.LlamaForCausalLM
    else:
        cfg = transformers.GPT2Config(vocab_size=s["vocab"], n_embd=s["d"], n_layer=s["layers"],
                                      n_head=s["heads"], n_positions=s["ctx"],
                                      activation_function="gelu_new")
        cls = transformers.GPT2LMHeadModel
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = cls(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
            elif "bias" in name:
                p.zero_()
            else:
                p.fill_(1.0)
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size="5GB")
    n = sum(p.numel() for p in model.parameters())
    emit(what="make", shape=args.shape, params=n, bytes=2 * n, seconds=round(time.time() - t0, 1))


def ceilings(args):
    n = 1 << 30  # 2 GiB of bf16 each way
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    reps = 20
    t = time.perf_counter()
    for _ in range(reps):
        b.copy_(a)
    torch.cuda.synchronize()
    copy = 2 * a.numel() * 2 * reps / (time.perf_counter() - t)
    del a, b
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    reps = 20
    t = time.perf_counter()
    for _ in range(reps):
        x @ y
    torch.cuda.synchronize()
    tflops = 2 * m ** 3 * reps / (time.perf_counter() - t) / 1e12
    emit(what="ceilings", copy_GBps=round(copy / 1e9, 1), gemm_TFLOPs=round(tflops, 1))


def hf(args):
    import transformers
    from transformers import AutoModelForCausalLM
    new = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56)
    kw = {"dtype" if new else "torch_dtype": torch.bfloat16}
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(args.model, **kw).to("cuda").eval()
    load_s = time.time() - t0
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    gen = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    compile_s = 0.0
    if args.mode == "compile":
        # A static cache makes generate compile the forward itself (torch.compile,
        # mode="reduce-overhead", fullgraph), marking each step for its CUDA graphs; a
        # forward compiled by hand outside generate has its cache overwritten by the graphs.
        model.generation_config.cache_implementation = "static"
        gen["cache_implementation"] = "static"
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.prompt), generator=g).cuda()
    mask = torch.ones_like(ids)

    def run(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, **gen)
        torch.cuda.synchronize()
        assert out.shape[1] == args.prompt + n, out.shape
        return time.perf_counter() - t

    t = time.time()
    run(args.new)  # warm-up (compiles under torch.compile)
    if args.mode == "compile":
        run(args.new)
    compile_s = time.time() - t
    first = min(run(1) for _ in range(2))
    total = run(args.new)
    decode_s = total - first
    emit(what="hf", mode=args.mode, model=args.model, batch=args.batch, prompt=args.prompt,
         new=args.new, time_to_first_token_ms=round(first * 1e3, 2),
         decode_tokens_per_s=round(args.batch * (args.new - 1) / decode_s, 1),
         load_s=round(load_s, 1), warmup_s=round(compile_s, 1),
         compiled_graphs=int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
         transformers=transformers.__version__, torch=torch.__version__)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True)
    m.add_argument("--out", required=True)
    sub.add_parser("ceilings")
    h = sub.add_parser("hf")
    h.add_argument("--model", required=True)
    h.add_argument("--batch", type=int, default=1)
    h.add_argument("--prompt", type=int, default=128)
    h.add_argument("--new", type=int, default=256)
    h.add_argument("--mode", choices=["eager", "compile"], default="eager")
    args = ap.parse_args()
    {"make": make, "ceilings": ceilings, "hf": hf}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
