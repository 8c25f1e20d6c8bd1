#!/usr/bin/env python3
"""The table of bench/decode_gpu.sh from its results.jsonl: per model and batch, decode
tokens/s of tandem, transformers eager and static cache + torch.compile, tandem's share of
the memory floor and its ratios; then the prefill against the GEMM ceiling."""
import json
import os
import sys


def model_bytes(cfg):
    """Weight bytes a decode step reads (bf16; the input embedding is gathered, not read,
    unless it is also the head) and KV bytes per cached position of one sequence."""
    if "n_embd" in cfg:  # GPT-2
        d, L, V, f = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], 4 * cfg["n_embd"]
        per_layer = 4 * d * d + 2 * d * f + 9 * d + f
        weights = L * per_layer + V * d + 2 * d  # the tied head reads wte
        kv = 2 * L * d * 2
    else:
        d, L, V, f = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["intermediate_size"]
        h, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = d // h
        per_layer = d * (h + 2 * kvh) * hd + h * hd * d + 3 * d * f + 2 * d
        weights = L * per_layer + V * d + d
        kv = 2 * L * kvh * hd * 2
    return 2 * weights, kv, weights


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    mdir = sys.argv[2]
    ceil = next((r for r in rows if r.get("what") == "ceilings"), {})
    copy = ceil.get("copy_GBps", 0) * 1e9
    gemm = ceil.get("gemm_TFLOPs", 0) * 1e12
    print(f"Copy bandwidth {ceil.get('copy_GBps', '?')} GB/s (read + write), bf16 GEMM "
          f"{ceil.get('gemm_TFLOPs', '?')} TFLOP/s, measured in this run.\n")
    print("| model | batch | tandem tok/s | floor share | TTFT ms | HF eager tok/s | compile tok/s "
          "| × eager | × compile |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("what") != "tandem" or r.get("new", 0) <= 2:
            continue
        name = os.path.basename(r["model"])
        cfg = json.load(open(os.path.join(mdir, name, "config.json")))
        wbytes, kvpos, _ = model_bytes(cfg)
        B, P, N = r["batch"], r["prompt"], r["new"]
        avg_ctx = P + N / 2
        step_bytes = wbytes + B * kvpos * avg_ctx
        floor = B / (step_bytes / copy) if copy else 0
        tps = r["decode_tokens_per_s"]

        def ref(mode):
            for x in rows:
                if x.get("what") == "hf" and x["mode"] == mode and x["batch"] == B and \
                        os.path.basename(x["model"]) == name:
                    return x["decode_tokens_per_s"]
            return None

        e, c = ref("eager"), ref("compile")
        fmt = lambda v: f"{v:,.1f}" if v else "—"
        print(f"| {name} | {B} | {tps:,.1f} | {tps / floor:.0%} | {r['time_to_first_token_ms']:.1f} "
              f"| {fmt(e)} | {fmt(c)} | {fmt(tps / e if e else None)} | {fmt(tps / c if c else None)} |")
    for r in rows:
        if r.get("what") == "tandem" and r.get("new", 0) <= 2:
            name = os.path.basename(r["model"])
            cfg = json.load(open(os.path.join(mdir, name, "config.json")))
            _, _, n = model_bytes(cfg)
            P = r["prompt"]
            L, d = cfg.get("num_hidden_layers", cfg.get("n_layer")), cfg.get("hidden_size", cfg.get("n_embd"))
            flops = 2 * n * P + 2 * L * P * P * d  # products + causal attention (QK^T and PV)
            tflops = flops / (r["time_to_first_token_ms"] / 1e3)
            print(f"\nPrefill of {P} tokens ({name}, batch 1): {r['time_to_first_token_ms']:.1f} ms to "
                  f"the first token, {tflops / 1e12:.0f} TFLOP/s = {tflops / gemm:.0%} of the GEMM ceiling.")
    for r in rows:
        if r.get("what") == "failed":
            print(f"\nFAILED: {r['run']}")


if __name__ == "__main__":
    main()
