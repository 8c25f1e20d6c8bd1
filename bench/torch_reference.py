#!/usr/bin/env python3
"""PyTorch reference trainer for tandem's GPU benchmarks: what a user would run instead.

A nanoGPT-style GPT-2 (tied embedding) or a Llama (RMSNorm, rotary, SwiGLU, untied head)
of one of tandem's presets, trained on random tokens with bf16 autocast, causal
scaled_dot_product_attention, fused AdamW and a global gradient-norm clip, in one of three
modes:

  eager    the model as written
  compile  torch.compile(model)
  fsdp2    torch.distributed.fsdp.fully_shard on every block and the root, bf16 parameters
           and fp32 gradient reduction (MixedPrecisionPolicy); one rank when started
           plainly, N ranks under torchrun or mpirun (rank, world size and local rank from
           their environment variables)

It runs warm-up steps, then timed steps (CUDA events around each step, synchronised, as a
training loop that logs every step's loss is), and prints one JSON line on stdout:

  {"impl": "torch-eager", "model": "gpt2-124m", "batch": 16, "seq": 1024,
   "tokens_per_s": ..., "ms_per_step": ..., "peak_mem_bytes": ..., "tflops": ..., ...}

ms_per_step is the median step; tokens_per_s counts every rank's tokens; tflops is model
TFLOP/s per GPU with bench/benchlib.py's FLOP count (6·N + 12·L·d·T per token);
peak_mem_bytes is torch.cuda.max_memory_allocated() (the largest over ranks).

    python3 bench/torch_reference.py --mode eager --model gpt2-124m --batch 16 --seq 1024
    python3 -m torch.distributed.run --standalone --nproc_per_node 8 \\
        bench/torch_reference.py --mode fsdp2 --model llama2-7b --batch 2 --seq 2048
    python3 bench/torch_reference.py --device cpu --model gpt2-tiny --batch 2 --seq 64  # dry run

Without PyTorch, or with --device cuda and no GPU visible to PyTorch, it prints an error
object ({"impl": ..., "error": ...}) and a message on stderr and exits with status 2.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402  (standard library only)

torch = nn = F = None  # imported in main(), so --help and the error path work without them


def log(msg):
    print(f"torch_reference: {msg}", file=sys.stderr, flush=True)


def fail(args, msg, code=2):
    print(json.dumps({"impl": f"torch-{args.mode}", "model": args.model, "batch": args.batch,
                      "seq": args.seq, "error": msg}), flush=True)
    log(f"error: {msg}")
    sys.exit(code)


# --- model ---------------------------------------------------------------------------------

def define_model():
    """The model classes; defined once torch is imported."""

    class RMSNorm(nn.Module):
        def __init__(self, d, eps):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * self.weight.float()).type_as(x)

    def attention(q, k, v):
        # q, k, v: (B, H, T, hd)
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[-2]  # PyTorch < 2.0 (CPU dry runs only): materialised softmax
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        return s.masked_fill(mask, float("-inf")).softmax(-1) @ v

    def rotate(x, cos, sin):
        # x: (B, H, T, hd), rotary on the two halves of each head; cos, sin: (T, hd/2)
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).type_as(x)

    class Block(nn.Module):
        def __init__(self, s):
            super().__init__()
            c, self.h, self.kv = s["d_model"], s["n_head"], s["n_kv_head"]
            self.hd = c // self.h
            self.llama = s["family"] == "llama"
            bias = not self.llama
            if self.llama:
                self.norm1 = RMSNorm(c, s.get("norm_eps", 1e-5))
                self.norm2 = RMSNorm(c, s.get("norm_eps", 1e-5))
            else:
                self.norm1, self.norm2 = nn.LayerNorm(c), nn.LayerNorm(c)
            self.qkv = nn.Linear(c, (self.h + 2 * self.kv) * self.hd, bias=bias)  # (Q, C)
            self.proj = nn.Linear(self.h * self.hd, c, bias=bias)                # (C, A)
            f = s["d_ff"]
            self.fc = nn.Linear(c, 2 * f if self.llama else f, bias=bias)  # gate|up or fc
            self.fc2 = nn.Linear(f, c, bias=bias)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            qkv = self.qkv(self.norm1(x))
            q, k, v = qkv.split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
            q = q.view(B, T, self.h, self.hd).transpose(1, 2)
            k = k.view(B, T, self.kv, self.hd).transpose(1, 2)
            v = v.view(B, T, self.kv, self.hd).transpose(1, 2)
            if self.llama:
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if self.kv != self.h:
                k = k.repeat_interleave(self.h // self.kv, dim=1)
                v = v.repeat_interleave(self.h // self.kv, dim=1)
            y = attention(q, k, v).transpose(1, 2).reshape(B, T, self.h * self.hd)
            x = x + self.proj(y)
            hmid = self.fc(self.norm2(x))
            if self.llama:
                gate, up = hmid.chunk(2, dim=-1)
                hmid = F.silu(gate) * up
            else:
                hmid = F.gelu(hmid, approximate="tanh")
            return x + self.fc2(hmid)

    class LM(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.s = s
            c, vp = s["d_model"], s["vocab_padded"]
            self.llama = s["family"] == "llama"
            self.recompute = s.get("recompute", False)
            self.wte = nn.Embedding(vp, c)
            self.wpe = None if self.llama else nn.Embedding(s["context"], c)
            self.blocks = nn.ModuleList([Block(s) for _ in range(s["n_layer"])])
            self.norm = RMSNorm(c, s.get("norm_eps", 1e-5)) if self.llama else nn.LayerNorm(c)
            self.head = nn.Linear(c, vp, bias=False)
            if not self.llama:
                self.head.weight = self.wte.weight  # tied, as GPT-2

        def rope(self, T, device):
            if not self.llama:
                return None, None
            hd = self.s["d_model"] // self.s["n_head"]
            theta = self.s.get("rope_theta", 10000.0)
            inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=device).float() / hd)
            ang = torch.outer(torch.arange(T, device=device).float(), inv)
            return ang.cos(), ang.sin()

        def forward(self, idx, tgt):
            T = idx.shape[1]
            x = self.wte(idx)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(T, device=idx.device))
            cos, sin = self.rope(T, idx.device)
            for b in self.blocks:
                if self.recompute and torch.is_grad_enabled():
                    # Activation checkpointing per block: only the block's input is kept,
                    # its forward runs again in the backward (tandem's --recompute unit).
                    x = torch.utils.checkpoint.checkpoint(b, x, cos, sin, use_reentrant=False)
                else:
                    x = b(x, cos, sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))

    return LM, RMSNorm


def init_weights(model, rms_norm_cls, std):
    """N(0, std) matrices and embeddings, zero biases, unit norm gains. Works on FSDP2's
    sharded parameters too: each rank fills its own shard (the local tensor)."""
    local = lambda p: p.to_local() if hasattr(p, "to_local") else p
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                local(m.weight).normal_(0.0, std)
                if getattr(m, "bias", None) is not None:
                    local(m.bias).zero_()
            elif isinstance(m, (nn.LayerNorm, rms_norm_cls)):
                local(m.weight).fill_(1.0)
                if getattr(m, "bias", None) is not None:
                    local(m.bias).zero_()


# --- distributed ---------------------------------------------------------------------------

def world_from_env():
    """(rank, world size, local rank) from torchrun's or Open MPI's variables; (0, 1, 0)."""
    def first(*names, default):
        for n in names:
            if os.environ.get(n):
                return int(os.environ[n])
        return default
    rank = first("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", default=0)
    world = first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default=1)
    local = first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", default=0)
    return rank, world, local


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(args, rank, world, device):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        # One process: any free port. Several under mpirun: one port they all agree on.
        os.environ["MASTER_PORT"] = str(free_port() if world == 1 else 29533)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kw = {"device_id": device} if device.type == "cuda" else {}
    try:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, **kw)
    except TypeError:  # older PyTorch without device_id
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
    return dist


# --- the benchmark -------------------------------------------------------------------------

def build(args, s, device, rank, world):
    LM, RMSNorm = define_model()
    torch.manual_seed(args.seed + rank)
    dist = None
    if args.mode == "fsdp2":
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except Exception as e:  # absent, or too old to import on this Python
            raise RuntimeError(f"fsdp2 needs torch.distributed.fsdp.fully_shard "
                               f"(PyTorch 2.6+; this is {torch.__version__}): {e}")
        from torch.distributed.device_mesh import init_device_mesh
        dist = init_distributed(args, rank, world, device)
        # The mesh names the device type: fully_shard's default would take cuda whenever a
        # GPU is visible, also for a CPU (gloo) run.
        mesh = init_device_mesh(device.type, (world,))
        # Built on the meta device, sharded, then materialised: no rank ever holds the
        # whole fp32 model (llama2-7b is 27 GB in fp32).
        with torch.device("meta"):
            model = LM(s)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in model.blocks:
            fully_shard(b, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        model.to_empty(device=device)
    elif hasattr(torch, "device") and hasattr(torch.device, "__enter__"):
        with device:
            model = LM(s)
    else:
        model = LM(s).to(device)
    init_weights(model, RMSNorm, args.init_std)
    return model, dist


def make_optimizer(args, model, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW(groups, **kw)


def run(args):
    rank, world, local_rank = world_from_env()
    if world > 1 and args.mode != "fsdp2":
        raise RuntimeError(f"{world} ranks: only --mode fsdp2 runs on several ranks")
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    s = dict(benchlib.shape(args.model), recompute=args.recompute)
    if args.seq > s["context"]:
        raise RuntimeError(f"--seq {args.seq} exceeds {args.model}'s context {s['context']}")

    model, dist = build(args, s, device, rank, world)
    fwd = model
    if args.mode == "compile":
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch.compile needs PyTorch 2.0+ (this is {torch.__version__})")
        fwd = torch.compile(model)
    opt = make_optimizer(args, model, device)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once

    g = torch.Generator(device="cpu").manual_seed(args.seed * 1000 + rank)
    x = torch.randint(0, s["vocab"], (args.batch, args.seq), generator=g).to(device)
    y = torch.randint(0, s["vocab"], (args.batch, args.seq), generator=g).to(device)
    # fsdp2 computes in bf16 through its MixedPrecisionPolicy; the others through autocast.
    use_autocast = args.mode != "fsdp2"

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
            loss = fwd(x, y)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if dist:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step().item()
    sync()
    warmup_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(args.steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            loss = step()
            times.append((time.perf_counter() - t) * 1e3)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    kernels = profile_kernels(args, step, sync) if args.kernels else None
    if dist:
        # A step lasts as long as its slowest rank; memory: the largest rank.
        t = torch.tensor(times + [float(peak)], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times, peak = t[:-1].tolist(), int(t[-1].item())
    ms = statistics.median(times)
    tokens_per_s = args.batch * args.seq * world / (ms / 1e3)
    fpt = benchlib.flops_per_token(args.model, args.seq)
    result = {
        "impl": f"torch-{args.mode}", "model": args.model, "batch": args.batch,
        "seq": args.seq, "ranks": world, "global_batch": args.batch * world,
        "tokens_per_s": round(tokens_per_s, 1),
        "tokens_per_s_per_gpu": round(tokens_per_s / world, 1),
        "ms_per_step": round(ms, 3), "ms_min": round(min(times), 3),
        "ms_max": round(max(times), 3), "peak_mem_bytes": int(peak),
        "tflops": round(fpt * tokens_per_s / world / 1e12, 2),
        "flops_per_token": fpt, "params": n_params, "warmup": args.warmup,
        "steps": args.steps, "warmup_s": round(warmup_s, 2), "loss": round(losses[-1], 4),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__, "dtype": "bf16", "recompute": args.recompute,
    }
    if kernels is not None and rank == 0:
        kernels["ms_per_step"] = result["ms_per_step"]
        with open(args.kernels, "w") as f:
            json.dump(kernels, f, indent=1)
    if dist:
        dist.destroy_process_group()
    return rank, result


def profile_kernels(args, step, sync):
    """Device kernels of args.kernel_steps more steps under torch.profiler: per kernel name,
    launches and microseconds per step (CUPTI's durations), as bench/benchlib.py's
    kernel-report reads them."""
    from torch.profiler import ProfilerActivity, profile
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.kernel_steps):
            step()
        sync()
    # The Chrome trace names every device event with its category and duration (us).
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kinds = {"kernel": "kernel", "gpu_memcpy": "copy", "gpu_memset": "copy"}
    totals = {}
    for ev in events:
        kind = kinds.get(ev.get("cat"))
        if kind is None or "dur" not in ev:
            continue
        key = (ev["name"], kind)
        c, us = totals.get(key, (0, 0.0))
        totals[key] = (c + 1, us + float(ev["dur"]))
    n = args.kernel_steps
    rows = [{"name": name, "kind": kind, "count": c / n, "us": us / n}
            for (name, kind), (c, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])]
    return {"impl": f"torch-{args.mode}", "model": args.model, "steps": n, "kernels": rows}


def main():
    ap = argparse.ArgumentParser(description="PyTorch reference trainer (one JSON line out)")
    ap.add_argument("--mode", choices=["eager", "compile", "fsdp2"], default="eager")
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(benchlib.MODEL_SHAPES))
    ap.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed steps first (default 3; 5 for compile)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="0 disables")
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--recompute", action="store_true",
                    help="checkpoint every block (torch.utils.checkpoint), as tandem's "
                         "--recompute unit")
    ap.add_argument("--kernels", metavar="FILE",
                    help="after the timed steps, profile --kernel-steps more with "
                         "torch.profiler and write each kernel's launches and time per step "
                         "to FILE (JSON)")
    ap.add_argument("--kernel-steps", type=int, default=2)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a dry run of the code path (use a tiny model)")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = 5 if args.mode == "compile" else 3
    if args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.seq < 1:
        ap.error("--steps, --batch and --seq must be positive, --warmup not negative")

    global torch, nn, F
    try:
        import torch as _torch
        import torch.nn as _nn
        import torch.nn.functional as _F
        import torch.utils.checkpoint  # noqa: F401  (--recompute)
    except ImportError as e:
        fail(args, f"PyTorch is not installed for {sys.executable} ({e}); on the GPU machine "
                   "run the python3 that holds it")
    torch, nn, F = _torch, _nn, _F
    if args.device == "cuda" and not torch.cuda.is_available():
        fail(args, f"CUDA is not available to PyTorch {torch.__version__} (built for CUDA "
                   f"{torch.version.cuda}; {torch.cuda.device_count()} device(s) visible)")

    try:
        rank, result = run(args)
    except Exception as e:  # out of memory, a bad option, a missing PyTorch feature
        traceback.print_exc(file=sys.stderr)
        fail(args, f"{type(e).__name__}: {str(e)[:400]}", code=1)
    if rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
