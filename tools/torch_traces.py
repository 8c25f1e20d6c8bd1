#!/usr/bin/env python3
"""Real PyTorch profiler traces for `tandem trace analyze` (tests/fixtures/traces).

On one CUDA GPU, with torch.distributed at world size 1 (NCCL, a FileStore), this script
records three small Chrome traces with torch.profiler and writes them gzipped to OUT:

  legacy_default.json.gz   each step issues, on a communication stream created blocking
                           (cudaStreamCreateWithFlags(..., cudaStreamDefault), wrapped in
                           torch.cuda.ExternalStream), an all_gather_into_tensor of a long
                           transfer and a device-to-device copy, then a train of
                           layer-sized bf16 GEMMs on the legacy default stream: the two
                           streams wait for each other, so the communication is exposed.
  nonblocking.json.gz      the same, the GEMMs on a dedicated torch.cuda.Stream() (created
                           non-blocking by PyTorch's stream pool; the log says what the flags
                           read): the streams no longer wait for each other, and how much of
                           the copies runs under the GEMMs is up to the SMs the copies hold.
  fsdp2.json.gz            FSDP2 (torch.distributed.fsdp.fully_shard) training steps of a tiny
                           transformer, with a profiler schedule, so the trace carries
                           ProfilerStep#N annotations and FSDP's own streams (at one rank only
                           the reduce-scatter's carries work).

At world size 1 NCCL's collectives are copies (ncclAllGather with one rank is a
device-to-device memcpy); the explicit copy makes sure the blocking stream carries
communication whatever the collective does. Each scenario records 4 iterations with
schedule(wait=1, warmup=1, active=2), so each trace holds two profiler steps.
OUT/torch_traces.log says what the script saw: torch, CUDA and NCCL versions, the GPU, the
streams' handles and flags, and per trace the device tracks (pid, tid, name), their event
counts by category and their longest events. tests/fixtures/traces holds the three traces of
one run as pytorch_<name>.json.gz, with its log and a README.

    NCCL_NVLS_ENABLE=0 python3 tools/torch_traces.py OUT
"""

import ctypes
import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

GEMM_N = 4096  # a layer-sized bf16 product: about 0.14 TFLOP, ~0.2 ms on an H200
GEMMS_PER_STEP = 8
GATHER_BYTES = 256 << 20  # the all_gather's input (= output at world size 1)
COPY_BYTES = 1 << 30  # the explicit device-to-device copy

LOG_FILE = None  # OUT/torch_traces.log, written line by line so a crash keeps what came before


def log(line=""):
    print(line, flush=True)
    if LOG_FILE is not None:
        LOG_FILE.write(line + "\n")
        LOG_FILE.flush()


# --- the CUDA runtime, for a blocking stream and for reading stream flags -----------------


def cudart():
    """The CUDA runtime library, through ctypes: the one the system has, else PyTorch's."""
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    for base in sys.path:
        pattern = os.path.join(base, "nvidia", "**", "libcudart.so*")
        names += sorted(glob.glob(pattern, recursive=True))
        names += sorted(glob.glob(os.path.join(base, "torch", "lib", "libcudart*.so*")))
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                                      ctypes.c_uint]
            lib.cudaStreamGetFlags.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]
            return lib, name
        except (OSError, AttributeError):
            continue
    return None, None


def stream_flags(lib, handle):
    """cudaStreamGetFlags of a stream handle: 0 = cudaStreamDefault (blocking), 1 = non-blocking."""
    if lib is None:
        return None
    flags = ctypes.c_uint(99)
    err = lib.cudaStreamGetFlags(ctypes.c_void_p(handle), ctypes.byref(flags))
    return flags.value if err == 0 else f"error {err}"


def blocking_stream(lib):
    """A stream created with cudaStreamDefault (it waits for the legacy default stream, and
    the legacy default stream for it), as a torch stream."""
    handle = ctypes.c_void_p()
    err = lib.cudaStreamCreateWithFlags(ctypes.byref(handle), 0)
    if err != 0:
        raise RuntimeError(f"cudaStreamCreateWithFlags failed: error {err}")
    return torch.cuda.ExternalStream(handle.value), handle.value


# --- what a trace holds ----------------------------------------------------------------------


DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def describe(path):
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name")
    procs = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e.get("pid")] = e.get("args", {}).get("name")
    tracks = {}
    steps = set()
    cats = {}
    for e in events:
        cats[e.get("cat")] = cats.get(e.get("cat"), 0) + 1
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            steps.add((e.get("name"), e.get("cat")))
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATS:
            continue
        t = tracks.setdefault((e.get("pid"), e.get("tid")), {"cats": {}, "events": []})
        t["cats"][e["cat"]] = t["cats"].get(e["cat"], 0) + 1
        t["events"].append((e.get("dur", 0), e.get("name"), e.get("args", {}).get("stream")))
    log(f"  {os.path.basename(path)}: {os.path.getsize(path)} bytes gzipped, {len(events)} events")
    log(f"    categories: {dict(sorted((str(k), v) for k, v in cats.items()))}")
    log(f"    processes: {procs}")
    log(f"    profiler steps: {sorted(steps, key=str)}")
    for (pid, tid), t in sorted(tracks.items(), key=lambda kv: str(kv[0])):
        log(f"    device track pid {pid!r} tid {tid!r} name {names.get((pid, tid))!r}: {t['cats']}")
        for dur, name, stream in sorted(t["events"], key=lambda x: -x[0])[:4]:
            log(f"      {dur:10.1f} us  args.stream={stream!r}  {str(name)[:100]}")


def write_trace(prof, out, name):
    raw = os.path.join(tempfile.mkdtemp(), name + ".json")
    prof.export_chrome_trace(raw)
    path = os.path.join(out, name + ".json.gz")
    with open(raw, "rb") as src, open(path, "wb") as dst:
        # mtime 0: the same trace gives the same bytes.
        with gzip.GzipFile(filename="", mode="wb", fileobj=dst, mtime=0, compresslevel=9) as gz:
            shutil.copyfileobj(src, gz)
    describe(path)


def profiler(out, name):
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=lambda p: write_trace(p, out, name),
    )


# --- the scenarios ---------------------------------------------------------------------------


def streams_scenario(out, name, compute, comm):
    """Communication issued first on `comm`, then a train of GEMMs on `compute`."""
    dev = torch.device("cuda", 0)
    a = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
    c = torch.empty(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
    g_in = torch.ones(GATHER_BYTES // 2, device=dev, dtype=torch.bfloat16)
    g_out = torch.empty(GATHER_BYTES // 2 * dist.get_world_size(), device=dev, dtype=torch.bfloat16)
    c_src = torch.ones(COPY_BYTES // 2, device=dev, dtype=torch.bfloat16)
    c_dst = torch.empty_like(c_src)
    torch.cuda.synchronize()
    with profiler(out, name) as prof:
        for _ in range(4):
            with torch.cuda.stream(comm):
                dist.all_gather_into_tensor(g_out, g_in)
                c_dst.copy_(c_src)
            with torch.cuda.stream(compute):
                for _ in range(GEMMS_PER_STEP):
                    torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
            prof.step()
    torch.cuda.synchronize()


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, C // self.heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=512, width=256, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def fsdp2_scenario(out):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    model = TinyTransformer().to(dev)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 512, (8, 128), device=dev)
    with profiler(out, "fsdp2") as prof:
        for _ in range(4):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            prof.step()
    log(f"  fsdp2 final loss {loss.item():.4f}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torch_traces.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    global LOG_FILE
    LOG_FILE = open(os.path.join(out, "torch_traces.log"), "w")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    started = time.time()
    log(f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {sys.version.split()[0]}")
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    torch.cuda.set_device(0)
    props = torch.cuda.get_device_properties(0)
    log(f"GPU 0: {props.name}, {props.multi_processor_count} SMs, "
        f"{props.total_memory / 2**30:.0f} GiB")
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    log(f"NCCL {nccl}, NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}")
    store_dir = tempfile.mkdtemp()
    store = dist.FileStore(os.path.join(store_dir, "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))

    lib, lib_name = cudart()
    log(f"CUDA runtime through ctypes: {lib_name}")
    legacy = torch.cuda.default_stream()
    dedicated = torch.cuda.Stream()
    if lib is not None:
        comm, comm_handle = blocking_stream(lib)
        how = "cudaStreamCreateWithFlags(cudaStreamDefault)"
    else:  # no runtime to create one: the traces still come, with a pool stream
        comm = torch.cuda.Stream()
        comm_handle = comm.cuda_stream
        how = "torch.cuda.Stream(), no CUDA runtime found through ctypes"
    log("streams (flags: cudaStreamGetFlags, 0 = blocking, 1 = cudaStreamNonBlocking):")
    for what, handle in (("torch.cuda.default_stream()", legacy.cuda_stream),
                         ("torch.cuda.Stream()", dedicated.cuda_stream),
                         (f"communication stream, {how}", comm_handle)):
        log(f"  {what}: handle {handle:#x}, flags {stream_flags(lib, handle)}")

    scenarios = [
        ("legacy_default", lambda: streams_scenario(out, "legacy_default", legacy, comm)),
        ("nonblocking", lambda: streams_scenario(out, "nonblocking", dedicated, comm)),
        ("fsdp2", lambda: fsdp2_scenario(out)),
    ]
    failed = 0
    for name, run in scenarios:
        log(f"{name}:")
        try:
            run()
        except Exception:  # record it, and go on to the next scenario
            failed += 1
            log(traceback.format_exc())
    dist.destroy_process_group()
    log(f"done in {time.time() - started:.1f} s, {failed} scenario(s) failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
