#!/usr/bin/env python3
"""Shared pieces of the GPU benchmarks (bench/train_gpu.sh, bench/multigpu.sh,
scripts/gpu-check.sh): model shapes and the FLOP count every implementation is measured
with, random token files, reading tandem's --metrics files, and the reports (tables,
planner against measurement, loss-curve comparison, link bandwidth). Standard library
only, so it runs under any python3; bench/torch_reference.py imports the shapes from here.

    benchlib.py tokens --out FILE --vocab V --count N [--seed S]
    benchlib.py flops MODEL SEQ
    benchlib.py vocab MODEL
    benchlib.py train-report --manifest runs.tsv --out-dir DIR [--reference IMPL] ...
    benchlib.py plan-vs-measured --tandem BIN --results results.json --out FILE.md ...
    benchlib.py compare-losses --reference REF.jsonl --run LABEL=FILE ... --out FILE.md
    benchlib.py links-report --links links.json --out FILE.md [--target-GBps 370]
"""
import argparse
import array
import csv
import datetime
import json
import math
import os
import random
import re
import statistics
import struct
import subprocess
import sys

# The presets of `tandem models` (src/model/config.cpp), as the references build them.
MODEL_SHAPES = {
    "gpt2-tiny": dict(family="gpt2", vocab=256, vocab_padded=256, context=256, d_model=128,
                      n_layer=4, n_head=4, n_kv_head=4, d_ff=512),
    "llama-tiny": dict(family="llama", vocab=256, vocab_padded=256, context=256, d_model=128,
                       n_layer=4, n_head=4, n_kv_head=2, d_ff=352, rope_theta=10000.0),
    "gpt2-124m": dict(family="gpt2", vocab=50257, vocab_padded=50304, context=1024,
                      d_model=768, n_layer=12, n_head=12, n_kv_head=12, d_ff=3072),
    "gpt2-350m": dict(family="gpt2", vocab=50257, vocab_padded=50304, context=1024,
                      d_model=1024, n_layer=24, n_head=16, n_kv_head=16, d_ff=4096),
    "gpt2-774m": dict(family="gpt2", vocab=50257, vocab_padded=50304, context=1024,
                      d_model=1280, n_layer=36, n_head=20, n_kv_head=20, d_ff=5120),
    "gpt2-1558m": dict(family="gpt2", vocab=50257, vocab_padded=50304, context=1024,
                       d_model=1600, n_layer=48, n_head=25, n_kv_head=25, d_ff=6400),
    # The Llama-1B shape of bench/llama-1b.json (a llama2-7b config narrowed).
    "llama-1b": dict(family="llama", vocab=32000, vocab_padded=32000, context=2048,
                     d_model=2048, n_layer=16, n_head=16, n_kv_head=8, d_ff=5632,
                     rope_theta=10000.0),
    "llama2-7b": dict(family="llama", vocab=32000, vocab_padded=32000, context=4096,
                      d_model=4096, n_layer=32, n_head=32, n_kv_head=32, d_ff=11008,
                      rope_theta=10000.0),
    "llama3-8b": dict(family="llama", vocab=128256, vocab_padded=128256, context=8192,
                      d_model=4096, n_layer=32, n_head=32, n_kv_head=8, d_ff=14336,
                      rope_theta=500000.0),
    # Eight blocks of Llama-3-8B (bench/llama3-8b-8l.json): the 8B row's blocks and head at
    # 8192 tokens, small enough for an 80 GB GPU without recompute.
    "llama3-8b-8l": dict(family="llama", vocab=128256, vocab_padded=128256, context=8192,
                         d_model=4096, n_layer=8, n_head=32, n_kv_head=8, d_ff=14336,
                         rope_theta=500000.0),
}


def shape(model):
    if model not in MODEL_SHAPES:
        raise SystemExit(f"benchlib: unknown model '{model}' (known: {', '.join(MODEL_SHAPES)})")
    return MODEL_SHAPES[model]


def matmul_params(model):
    """[FLOP count] N: the weights that take part in matrix products, per token: each block's
    QKV, attention output and MLP matrices, plus the output head at the padded vocabulary
    (tied or not). Left out: position embeddings, biases, norm gains and the input
    embedding lookup (no multiply-adds). This is the count of tandem's planner
    (docs/planner.md); it is within 0.1% of nanoGPT's "parameters without the position
    embedding" for GPT-2."""
    s = shape(model)
    c, f, L = s["d_model"], s["d_ff"], s["n_layer"]
    hd = c // s["n_head"]
    qkv = c * (s["n_head"] + 2 * s["n_kv_head"]) * hd
    attn_out = s["n_head"] * hd * c
    mlp = (2 if s["family"] == "gpt2" else 3) * c * f
    return L * (qkv + attn_out + mlp) + c * s["vocab_padded"]


def flops_per_token(model, seq):
    """Training FLOPs per token, forward plus backward: 6·N + 12·L·d·T (attention scores and
    their weighted sum, not halved for the causal mask, as llm.c, nanoGPT and the planner
    count). The same number for every implementation of a model."""
    s = shape(model)
    return 6 * matmul_params(model) + 12 * s["n_layer"] * s["d_model"] * seq


# --- token files ---------------------------------------------------------------------------

def write_tokens(path, vocab, count, seed=1234):
    """A tandem token file (docs/formats.md) of `count` uniform random tokens below `vocab`."""
    width = 2 if vocab <= 65536 else 4
    code = "H" if width == 2 else "I"
    assert array.array(code).itemsize == width
    rng = random.Random(seed)
    raw = array.array(code, rng.randbytes(count * width))
    toks = array.array(code, (t % vocab for t in raw))
    if sys.byteorder != "little":
        toks.byteswap()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"TNDMTOK\0" + struct.pack("<IIQQ", 1, width, count, 0))
        toks.tofile(f)
    os.replace(tmp, path)


# --- tandem metrics ------------------------------------------------------------------------

def read_metrics(path):
    """The per-step objects of a `tandem train --metrics` file; a final {"summary": true, ...}
    line (and any other line holding "summary") is skipped."""
    steps = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            if "summary" in obj:
                continue
            steps.append(obj)
    return steps


def summarize_metrics(steps, warmup):
    """Medians over the steps after the first `warmup` (peak memory: the largest)."""
    kept = steps[warmup:]
    if not kept:
        raise ValueError(f"{len(steps)} step(s) in the metrics file, none after {warmup} warm-up")
    med = lambda k: statistics.median(float(m[k]) for m in kept)
    return {
        "steps_used": len(kept),
        "ms_per_step": med("step_ms"),
        "compute_ms": med("compute_ms"),
        "comm_ms": med("comm_ms"),
        "exposed_comm_ms": med("exposed_comm_ms"),
        "exposed_share": statistics.median(m["exposed_comm_ms"] / m["step_ms"] for m in kept),
        "reported_tokens_per_s": med("tokens_per_s"),
        "peak_mem_bytes": max(int(m["peak_mem_bytes"]) for m in steps),
        "last_loss": float(steps[-1]["loss"]),
    }


def last_json_line(path):
    """The last line of a file that parses as a JSON object, or None."""
    found = None
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        found = json.loads(line)
                    except json.JSONDecodeError:
                        pass
    except FileNotFoundError:
        return None
    return found


def last_error_line(path):
    """The last non-empty line of a log: what a failed row shows."""
    try:
        with open(path, errors="replace") as f:
            lines = [l.strip() for l in f if l.strip()]
    except FileNotFoundError:
        return ""
    return lines[-1][:200] if lines else ""


# --- markdown ------------------------------------------------------------------------------

def md_table(header, rows, align=None):
    align = align or ["---:"] * len(header)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def fmt_ms(x):
    """Milliseconds with three significant figures at least (tiny CPU runs read 0.0 else)."""
    if x is None:
        return "—"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


# --- train-report --------------------------------------------------------------------------

MANIFEST_FIELDS = ["impl", "model", "strategy", "ranks", "batch", "global_batch", "seq",
                   "status", "seconds", "result", "log", "command"]


def read_manifest(path):
    rows = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            parts += [""] * (len(MANIFEST_FIELDS) - len(parts))
            r = dict(zip(MANIFEST_FIELDS, parts))
            for k in ("ranks", "batch", "global_batch", "seq"):
                r[k] = int(r[k])
            r["seconds"] = float(r["seconds"] or 0)
            rows.append(r)
    return rows


def measure_row(r, warmup):
    """Fills a manifest row's numbers from its result file (tandem metrics or a reference's
    JSON line). ms/step and tokens/s come from the same median for every implementation."""
    out = dict(r)
    for k in ("ms_per_step", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
              "peak_mem_bytes", "compute_ms", "comm_ms", "exposed_comm_ms", "exposed_share",
              "error"):
        out.setdefault(k, None)
    if r["status"] != "ok":
        j = last_json_line(r["result"]) if r["result"] not in ("", "-") else None
        out["error"] = (j or {}).get("error") or last_error_line(r["log"])
        return out
    try:
        if r["impl"].startswith("tandem"):
            s = summarize_metrics(read_metrics(r["result"]), warmup)
            out.update(s)
        else:
            j = last_json_line(r["result"])
            if j is None or "error" in j or "ms_per_step" not in j:
                raise ValueError((j or {}).get("error", "no result line"))
            out["ms_per_step"] = float(j["ms_per_step"])
            out["peak_mem_bytes"] = int(j["peak_mem_bytes"])
            out["reference"] = j
    except (OSError, ValueError, KeyError) as e:
        out["status"] = "failed (unreadable result)"
        out["error"] = str(e)[:200]
        return out
    tokens = r["global_batch"] * r["seq"]
    out["tokens_per_s"] = tokens / (out["ms_per_step"] / 1e3)
    out["tokens_per_s_per_gpu"] = out["tokens_per_s"] / r["ranks"]
    out["flops_per_token"] = flops_per_token(r["model"], r["seq"])
    out["tflops_per_gpu"] = out["flops_per_token"] * out["tokens_per_s_per_gpu"] / 1e12
    return out


def train_report(args):
    rows = [measure_row(r, args.warmup) for r in read_manifest(args.manifest)]
    ref = {}
    for r in rows:
        if r["impl"] == args.reference and r["tokens_per_s"]:
            ref[(r["model"], r["ranks"])] = r["tokens_per_s"]
    compiled = {(r["model"], r["ranks"]): r["tokens_per_s"] for r in rows
                if r["impl"] == "torch-compile" and r["tokens_per_s"]}
    for r in rows:
        base = ref.get((r["model"], r["ranks"]))
        r["vs_reference"] = r["tokens_per_s"] / base if base and r["tokens_per_s"] else None
        c = compiled.get((r["model"], r["ranks"]))
        r["vs_compile"] = r["tokens_per_s"] / c if c and r["tokens_per_s"] else None
    with_compile = bool(compiled) and args.reference != "torch-compile"
    multi = any(r["ranks"] > 1 for r in rows)
    torch_versions = sorted({r["reference"].get("torch", "?") for r in rows if r.get("reference")})

    header = ["model", "impl", "GPUs", "batch x seq", "tokens/s"]
    if multi:
        header.append("tokens/s/GPU")
    header += ["ms/step", "model TFLOP/s/GPU" if multi else "model TFLOP/s", "peak mem GiB",
               "exposed comm ms (share)", f"vs {args.reference}"]
    if with_compile:
        header.append("vs torch-compile")
    header.append("status")
    table = []
    for r in rows:
        ok = r["tokens_per_s"] is not None
        exposed = (f"{r['exposed_comm_ms']:.2f} ({100 * r['exposed_share']:.1f}%)"
                   if r["exposed_comm_ms"] is not None else "—")
        line = [r["model"], r["impl"], r["ranks"], f"{r['batch']} x {r['seq']}",
                fmt(r["tokens_per_s"], ",.0f")]
        if multi:
            line.append(fmt(r["tokens_per_s_per_gpu"], ",.0f"))
        line += [fmt(r["ms_per_step"], ".1f"), fmt(r["tflops_per_gpu"], ".1f"),
                 fmt(r["peak_mem_bytes"] / 2**30 if ok else None, ".2f"), exposed,
                 fmt(r["vs_reference"], ".2f")]
        if with_compile:
            line.append(fmt(r["vs_compile"], ".2f"))
        line += [r["status"] if ok or r["status"].startswith("skipped")
                 else f"{r['status']}: {(r['error'] or 'see its log')[:120]}"]
        table.append(line)
    align = ["---", "---"] + ["---:"] * (len(header) - 3) + ["---"]

    gaps = []
    by = {(r["model"], r["ranks"], r["impl"]): r for r in rows}
    for (model, ranks, impl), r in by.items():
        none = by.get((model, ranks, "tandem-none"))
        if impl != "tandem-full" or not none or not r["ms_per_step"] or not none["ms_per_step"]:
            continue
        gap = r["ms_per_step"] / none["ms_per_step"] - 1
        gaps.append({"model": model, "ranks": ranks, "full_ms": r["ms_per_step"],
                     "none_ms": none["ms_per_step"], "gap": gap,
                     "full_exposed_ms": r["exposed_comm_ms"],
                     "none_exposed_ms": none["exposed_comm_ms"]})

    flops_lines = sorted({(r["model"], r["seq"]) for r in rows})
    md = [f"# {args.title}", ""]
    md += [f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}"]
    if args.machine:
        md.append(f"- machine: {args.machine}")
    if torch_versions:
        md.append(f"- PyTorch: {', '.join(torch_versions)} (bench/torch_reference.py)")
    md += [f"- tandem: medians over steps {args.warmup + 1}.. of each run; references: median "
           "of their timed steps (after their own warm-up); tokens/s = global batch x seq / "
           "median step time for every row",
           "- model TFLOP/s = (6·N + 12·L·d·T) x tokens/s, N = weights in matrix products "
           "(blocks + output head at the padded vocabulary; no position embedding, biases or "
           "norms): " + "; ".join(
               f"{m} T={t}: N = {matmul_params(m) / 1e6:.2f}M, "
               f"{flops_per_token(m, t) / 1e9:.3f} GFLOP/token" for m, t in flops_lines),
           "- peak mem: tandem reports its planned bytes per rank (arena + shards), PyTorch "
           "`torch.cuda.max_memory_allocated()`", ""]
    md.append(md_table(header, table, align))
    if gaps:
        md += ["", "tandem `full` against `none` (same model, same GPUs):", ""]
        for g in gaps:
            md.append(f"- {g['model']} on {g['ranks']} GPU(s): full {g['full_ms']:.1f} ms vs "
                      f"none {g['none_ms']:.1f} ms per step ({100 * g['gap']:+.1f}%); exposed "
                      f"communication {fmt(g['full_exposed_ms'], '.2f')} vs "
                      f"{fmt(g['none_exposed_ms'], '.2f')} ms")
    text = "\n".join(md) + "\n"
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, args.name + ".md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out_dir, args.name + ".json"), "w") as f:
        json.dump({"title": args.title, "machine": args.machine, "warmup": args.warmup,
                   "reference": args.reference, "rows": rows, "full_vs_none": gaps},
                  f, indent=1, default=str)
    print(text)
    failed = [r for r in rows if r["status"] != "ok" and not r["status"].startswith("skipped")]
    return 1 if failed else 0


# --- plan-vs-measured ----------------------------------------------------------------------

def links_ranks(path):
    try:
        with open(path) as f:
            return int(json.load(f).get("ranks", 0))
    except (OSError, ValueError, TypeError):
        return 0


def row_compute(args, model):
    """The compute file of a row: its model's own (DIR/compute_NAME.json from `tandem probe
    compute --model`, with kernel tables of that shape) when --compute-dir has one, else
    --compute."""
    if args.compute_dir:
        name = os.path.basename(model)
        name = name[:-5] if name.endswith(".json") else name
        own = os.path.join(args.compute_dir, f"compute_{name}.json")
        if os.path.exists(own):
            return own
    if args.compute and os.path.exists(args.compute):
        return args.compute
    return None


def plan_vs_measured(args):
    with open(args.results) as f:
        results = json.load(f)
    measured = [r for r in results["rows"] if r["impl"].startswith("tandem-")
                and r.get("ms_per_step") and r.get("strategy")]
    notes = []
    rows, data, off_limit = [], [], 0
    for r in measured:
        ranks, strategy = r["ranks"], r["strategy"]
        micro = r["global_batch"] // (r["batch"] * ranks)
        cmd = [args.tandem, "plan", "--model", r["model"], "--ranks", str(ranks), "--batch",
               str(r["batch"]), "--seq", str(r["seq"]), "--micro-steps", str(micro),
               "--hardware", args.hardware, "--json"]
        if strategy == "hybrid":
            cmd += ["--shard-group", str(args.shard_group)]
        compute = row_compute(args, r["model"])
        if compute:
            cmd += ["--compute", compute]
        if args.links and os.path.exists(args.links):
            if links_ranks(args.links) >= 2:
                cmd += ["--links", args.links]
            else:
                note = (f"{args.links} was measured at fewer than 2 ranks, which the planner "
                        f"refuses: links from the {args.hardware} preset")
                if note not in notes:
                    notes.append(note)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            rows.append([r["model"], strategy, ranks, f"plan failed: {p.stderr.strip()[:150]}"]
                        + [""] * 7)
            off_limit += 1
            continue
        plan = json.loads(p.stdout)
        entry = next((s for s in plan["strategies"] if s["name"] == strategy), None)
        if entry is None:
            rows.append([r["model"], strategy, ranks, "not in the plan"] + [""] * 7)
            off_limit += 1
            continue
        off = entry["step_ms"] / r["ms_per_step"] - 1
        exp_off = None
        if r.get("exposed_comm_ms"):
            exp_off = entry["exposed_comm_ms"] / r["exposed_comm_ms"] - 1
        within = abs(off) <= args.tolerance
        off_limit += 0 if within else 1
        rows.append([r["model"], strategy, ranks, fmt_ms(entry["step_ms"]),
                     fmt_ms(r["ms_per_step"]), f"{100 * off:+.1f}%",
                     fmt_ms(entry["exposed_comm_ms"]), fmt_ms(r.get("exposed_comm_ms")),
                     "—" if exp_off is None else f"{100 * exp_off:+.0f}%",
                     f"{entry['peak_mem_bytes'] / 2**30:.2f} / "
                     f"{r['peak_mem_bytes'] / 2**30:.2f}",
                     "yes" if within else "NO"])
        data.append({"model": r["model"], "strategy": strategy, "ranks": ranks,
                     "batch": r["batch"], "seq": r["seq"], "command": " ".join(cmd),
                     "predicted": entry, "measured": {k: r.get(k) for k in (
                         "ms_per_step", "compute_ms", "comm_ms", "exposed_comm_ms",
                         "peak_mem_bytes")}, "step_off": off, "within": within,
                     "hardware": plan.get("hardware", {}).get("source"),
                     "kernel_cost": plan.get("kernel_cost")})
    header = ["model", "strategy", "GPUs", "predicted ms/step", "measured ms/step", "off",
              "predicted exposed ms", "measured exposed ms", "exposed off",
              "peak GiB predicted / tandem", f"within {100 * args.tolerance:.0f}%"]
    md = [f"# {args.title}", "",
          f"`tandem plan --hardware {args.hardware}`"
          + (f" with `--compute {os.path.basename(args.compute)}`" if args.compute and
             os.path.exists(args.compute) else "")
          + (f" (each row's own `compute_MODEL.json` from {args.compute_dir} where there is "
             "one: kernel tables of its shape)" if args.compute_dir else "")
          + " against the measured medians of " + os.path.basename(args.results)
          + ". off = predicted / measured - 1.", ""]
    md += [f"- note: {n}" for n in notes]
    if data:
        md.append(f"- hardware layers: {data[0]['hardware']}")
    md += ["", md_table(header, rows, ["---", "---"] + ["---:"] * 8 + ["---"])]
    if not rows:
        md.append("\n(no measured tandem rows in the results)")
    text = "\n".join(md) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tolerance": args.tolerance, "rows": data, "notes": notes}, f, indent=1)
    print(text)
    if not rows:
        return 1
    return 1 if (args.strict and off_limit) else 0


# --- compare-losses ------------------------------------------------------------------------

def compare_losses(args):
    """Loss curves of runs against a reference run (same model, data and global batch): pass
    when step 1 agrees within rtol_first and every step within rtol, relative to the
    reference's loss."""
    ref = read_metrics(args.reference)
    ref_loss = [float(m["loss"]) for m in ref]
    header = ["run", "steps", "step-1 loss (ref)", "step-1 diff", "max rel diff (step)",
              "mean rel diff", "final loss (ref)", "verdict"]
    rows, failed = [], 0
    for spec in args.run:
        label, path = spec.split("=", 1)
        try:
            loss = [float(m["loss"]) for m in read_metrics(path)]
        except (OSError, ValueError) as e:
            rows.append([label, "—", "—", "—", "—", "—", "—", f"FAIL: {str(e)[:80]}"])
            failed += 1
            continue
        n = min(len(loss), len(ref_loss))
        if n == 0 or len(loss) != len(ref_loss):
            rows.append([label, f"{len(loss)} vs {len(ref_loss)}", "—", "—", "—", "—", "—",
                         "FAIL: step counts differ"])
            failed += 1
            continue
        rel = [abs(a - b) / abs(b) if all(map(math.isfinite, (a, b))) else math.inf
               for a, b in zip(loss, ref_loss)]
        worst = max(range(n), key=lambda i: rel[i])
        ok = rel[0] <= args.rtol_first and rel[worst] <= args.rtol
        failed += 0 if ok else 1
        rows.append([label, n, f"{loss[0]:.4f} ({ref_loss[0]:.4f})", f"{100 * rel[0]:.3f}%",
                     f"{100 * rel[worst]:.3f}% ({worst + 1})",
                     f"{100 * statistics.fmean(rel):.3f}%",
                     f"{loss[-1]:.4f} ({ref_loss[-1]:.4f})", "pass" if ok else "FAIL"])
    md = [f"## {args.title}", "",
          f"Reference: {os.path.basename(args.reference)}. Pass: |loss - ref| / ref at most "
          f"{100 * args.rtol_first:.2f}% at step 1 and {100 * args.rtol:.2f}% at every step.", "",
          md_table(header, rows, ["---"] + ["---:"] * 6 + ["---"])]
    text = "\n".join(md) + "\n"
    with open(args.out, "a" if args.append else "w") as f:
        f.write(text + "\n")
    print(text)
    return 1 if failed else 0


# --- links-report --------------------------------------------------------------------------

def links_report(args):
    with open(args.links) as f:
        links = json.load(f)
    ranks = links.get("ranks")
    target_bytes = args.size
    header = ["collective", "bytes", "time us", "algbw GB/s", "busbw GB/s",
              f"busbw / {args.target_GBps:.0f} GB/s", "wrong"]
    rows = []
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        sweep = links.get(op) or []
        if not sweep:
            continue
        m = min(sweep, key=lambda e: abs(math.log(e["bytes"] / target_bytes)))
        share = m["busbw_GBps"] / args.target_GBps if ranks and ranks > 1 else None
        rows.append([op, human_bytes(m["bytes"]), f"{m['time_us']:.1f}", f"{m['algbw_GBps']:.1f}",
                     f"{m['busbw_GBps']:.1f}", fmt(None if share is None else 100 * share,
                                                   ".0f") + ("%" if share else ""), m["wrong"]])
    md = [f"# {args.title}", "",
          f"`tandem probe links` at {ranks} rank(s), the measured size nearest "
          f"{target_bytes / 2**30:g} GiB; reference: {args.target_GBps:.0f} GB/s busbw "
          "(NCCL all-gather / reduce-scatter on 8 H100/H200 over NVLink)."
          + (" At one rank busbw is 0 by definition." if ranks == 1 else ""), "",
          md_table(header, rows, ["---"] + ["---:"] * 6)]
    text = "\n".join(md) + "\n"
    with open(args.out, "a" if args.append else "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


def human_bytes(n):
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def parse_size(text):
    units = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3,
             "mb": 10**6, "gb": 10**9}
    t = text.strip().lower()
    num = t.rstrip("abgikm")
    return int(float(num) * units[t[len(num):]])



# --- kernel classes (profile_gpu.sh) -----------------------------------------------------

# Classes of device kernels by name, first match wins. Names come from tandem's kernels
# (src/device/cuda), cuBLASLt, NCCL, and PyTorch's eager, Triton (torch.compile) and
# attention kernels.
KERNEL_CLASSES = [
    ("communication", r"nccl"),
    ("optimizer", r"adam|multi_tensor|foreach|optim|clip|ssq_|sum_to_double"),
    ("attention backward",
     r"(flash|fmha|sdpa|attention|softmax_causal).*(bwd|backward|dq|dkv|dot_do_o)"
     r"|(bwd|backward).*(flash|fmha|sdpa|attention)"),
    ("attention forward", r"flash|fmha|sdpa|attention|softmax_causal"),
    ("GEMM", r"gemm|nvjet|xmma|cutlass|cublas|sm90_|wgmma|splitk|Kernel2"),
    ("loss", r"cross_entropy|ce_f|nll|log_softmax|logsumexp|_softmax|loss"),
    ("norm", r"norm|rms"),
    ("embedding", r"embedding|embed|index|scatter|gather"),
]


def kernel_class(name, kind="kernel"):
    if kind == "copy":
        return "copies and memsets"
    for cls, pattern in KERNEL_CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return cls
    return "other memory-bound"


def read_ncu_csv(path):
    """Kernel rows of `ncu --csv --page raw --metrics gpu__time_duration.sum`: a list of
    (name, stream, microseconds)."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        raise SystemExit(f"{path}: no ncu CSV rows")
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    for need in ("Kernel Name", "gpu__time_duration.sum"):
        if need not in col:
            raise SystemExit(f"{path}: no column {need!r} (columns: {head})")
    units = "nsecond"
    out = []
    for r in rows[1:]:
        if not r or not r[0].strip().isdigit():
            if r and len(r) > col["gpu__time_duration.sum"]:
                units = r[col["gpu__time_duration.sum"]] or units
            continue
        v = float(r[col["gpu__time_duration.sum"]].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(units, 1e-3)
        stream = r[col["Stream"]] if "Stream" in col else "?"
        out.append((r[col["Kernel Name"]], stream, v * scale))
    return out


def per_step_kernels(short, long_, steps):
    """Per-step kernels from two profiles of the same run that differ by `steps` steps:
    what the longer one launched beyond the shorter, per name. Returns rows of
    {name, kind, count, us, stream}."""
    def totals(rows):
        t = {}
        for name, stream, us in rows:
            c, u, streams = t.get(name, (0, 0.0, set()))
            streams.add(stream)
            t[name] = (c + 1, u + us, streams)
        return t
    a, b = totals(short), totals(long_)
    out = []
    for name, (c, us, streams) in b.items():
        c0, us0, _ = a.get(name, (0, 0.0, set()))
        if c - c0 <= 0:
            continue
        out.append({"name": name, "kind": "kernel", "count": (c - c0) / steps,
                    "us": (us - us0) / steps, "stream": ",".join(sorted(streams))})
    return out


def kernel_report(args):
    """Per-class device time of one step: tandem (ncu, each kernel timed alone) against a
    PyTorch profile (torch.profiler), with each side's measured step time."""
    sides = []
    if args.tandem_short and args.tandem_long:
        rows = per_step_kernels(read_ncu_csv(args.tandem_short), read_ncu_csv(args.tandem_long),
                                args.tandem_steps)
        sides.append(("tandem", rows, args.tandem_ms))
    for path in args.torch or []:
        with open(path) as f:
            doc = json.load(f)
        sides.append((doc.get("impl", "torch"), doc["kernels"], doc.get("ms_per_step")))
    if not sides:
        raise SystemExit("kernel-report: nothing to report")
    classes = [c for c, _ in KERNEL_CLASSES] + ["other memory-bound", "copies and memsets"]
    order = ["GEMM", "attention forward", "attention backward", "norm", "loss", "embedding",
             "optimizer", "other memory-bound", "copies and memsets", "communication"]
    order += [c for c in classes if c not in order]
    per = []
    for label, rows, ms in sides:
        by = {}
        for r in rows:
            cls = kernel_class(r["name"], r.get("kind", "kernel"))
            c, us = by.get(cls, (0.0, 0.0))
            by[cls] = (c + r["count"], us + r["us"])
        per.append((label, by, ms, rows))
    header = ["class"]
    for label, _, _, _ in per:
        header += [f"{label} ms", f"{label} launches"]
    table = []
    for cls in order:
        if not any(cls in by for _, by, _, _ in per):
            continue
        row = [cls]
        for _, by, _, _ in per:
            c, us = by.get(cls, (0.0, 0.0))
            row += [f"{us / 1e3:.2f}", f"{c:.0f}"]
        table.append(row)
    total = ["sum of kernels (communication excluded)"]
    step = ["measured step"]
    gap = ["step - sum (launch gaps, overlap)"]
    for _, by, ms, _ in per:
        s_us = sum(us for cls, (c, us) in by.items() if cls != "communication")
        n = sum(c for cls, (c, us) in by.items() if cls != "communication")
        total += [f"{s_us / 1e3:.2f}", f"{n:.0f}"]
        step += [fmt(ms, ".2f") if ms else "-", ""]
        gap += [f"{ms - s_us / 1e3:.2f}" if ms else "-", ""]
    table += [total, step, gap]
    lines = [f"### {args.title}", "", md_table(header, table), ""]
    for label, _, _, rows in per:
        lines.append(f"Largest kernels, {label} (ms per step, launches):")
        lines.append("")
        for r in sorted(rows, key=lambda r: -r["us"])[:args.top]:
            name = r["name"] if len(r["name"]) <= 90 else r["name"][:87] + "..."
            lines.append(f"- {r['us'] / 1e3:.3f} ms, {r['count']:.0f}x [{kernel_class(r['name'], r.get('kind', 'kernel'))}] `{name}`")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"impl": label, "ms_per_step": ms,
                        "classes": {c: {"launches": v[0], "us": v[1]} for c, v in by.items()}}
                       for label, by, ms, _ in per], f, indent=1)
    return 0

def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokens", help="write a random tandem token file")
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--count", type=int, default=1 << 21)
    p.add_argument("--seed", type=int, default=1234)
    p = sub.add_parser("flops", help="training FLOPs per token of a model at a sequence length")
    p.add_argument("model")
    p.add_argument("seq", type=int)
    p = sub.add_parser("vocab", help="a model's vocabulary size")
    p.add_argument("model")
    p = sub.add_parser("train-report", help="table of a benchmark's runs")
    p.add_argument("--manifest", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--name", default="results")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reference", default="torch-eager")
    p.add_argument("--title", default="Training throughput")
    p.add_argument("--machine", default="")
    p = sub.add_parser("plan-vs-measured", help="tandem plan against measured step times")
    p.add_argument("--tandem", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--json")
    p.add_argument("--compute")
    p.add_argument("--compute-dir", help="folder of compute_MODEL.json files, one per model")
    p.add_argument("--links")
    p.add_argument("--hardware", default="h200-sxm")
    p.add_argument("--shard-group", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--strict", action="store_true", help="exit 1 when a step time is off more")
    p.add_argument("--title", default="Planner against measurement")
    p = sub.add_parser("compare-losses", help="loss curves against a reference run")
    p.add_argument("--reference", required=True)
    p.add_argument("--run", action="append", default=[], help="LABEL=metrics.jsonl")
    p.add_argument("--rtol", type=float, default=0.01)
    p.add_argument("--rtol-first", type=float, default=0.002)
    p.add_argument("--out", required=True)
    p.add_argument("--append", action="store_true")
    p.add_argument("--title", default="Loss curves")
    p = sub.add_parser("links-report", help="collective bandwidth at one size")
    p.add_argument("--links", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--size", type=parse_size, default=2**30)
    p.add_argument("--target-GBps", type=float, default=370.0)
    p.add_argument("--append", action="store_true")
    p.add_argument("--title", default="Collective bandwidth")
    p = sub.add_parser("kernel-report", help="device time per kernel class of one step")
    p.add_argument("--tandem-short", help="ncu CSV of a run of S steps")
    p.add_argument("--tandem-long", help="ncu CSV of the same run with S + --tandem-steps")
    p.add_argument("--tandem-steps", type=int, default=1)
    p.add_argument("--tandem-ms", type=float, help="tandem's measured ms per step")
    p.add_argument("--torch", action="append", help="torch_reference.py --kernels FILE")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out")
    p.add_argument("--json")
    p.add_argument("--title", default="Device time per kernel class, one step")
    args = ap.parse_args(argv)

    if args.cmd == "tokens":
        write_tokens(args.out, args.vocab, args.count, args.seed)
        print(f"wrote {args.count} random tokens below {args.vocab} to {args.out}")
        return 0
    if args.cmd == "vocab":
        print(shape(args.model)["vocab"])
        return 0
    if args.cmd == "flops":
        print(flops_per_token(args.model, args.seq))
        return 0
    return {"train-report": train_report, "plan-vs-measured": plan_vs_measured,
            "compare-losses": compare_losses, "links-report": links_report,
            "kernel-report": kernel_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
