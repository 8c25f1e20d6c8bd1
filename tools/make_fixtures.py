#!/usr/bin/python3
"""Generate the PyTorch reference fixtures that tests/unit/test_fixtures.cpp compares against.

For each tiny preset (gpt2-tiny, llama-tiny) this script

  1. asks tandem for its initial weights (`tandem export --model NAME --seed 1234`),
  2. rebuilds the model independently in PyTorch, in float64,
  3. computes, on a fixed batch of B=2 sequences of T=24 byte tokens, the logits, the mean
     cross-entropy and the gradient of every parameter,
  4. runs 10 AdamW steps (torch.optim.AdamW + clip_grad_norm_) on that same batch, recording
     the loss before each update and the total change of the parameters of a few units,

and writes everything to OUT/<name>.safetensors (float32 / int32 tensors, string metadata).

Run with the interpreter that has torch (PyTorch >= 1.13, numpy):

    /usr/bin/python3 tools/make_fixtures.py --tandem build/tandem --out tests/fixtures
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

SEED = 1234  # both the weight-initialisation seed and the token seed
B, T = 2, 24
STEPS = 10
# tandem's OptimConfig for the training replica (see src/optim/optim.h).
OPTIM = dict(lr=1e-3, warmup=2, total=STEPS, min_lr_ratio=0.1, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, grad_clip=1.0)
# Units whose accumulated 10-step parameter change is stored as "update.<param>" (all of them
# would double the file size; these cover every kind of parameter).
UPDATE_UNITS = ("embedding.", "block.0.", "head.")

# The tiny presets, written out here rather than read from tandem (src/model/config.cpp).
# The exported file's metadata is checked against them.
PRESETS = {
    "gpt2-tiny": dict(family="gpt2", vocab=256, vocab_padded=256, context=256, d_model=128,
                      n_layer=4, n_head=4, n_kv_head=4, d_ff=512, norm_eps=1e-5),
    "llama-tiny": dict(family="llama", vocab=256, vocab_padded=256, context=256, d_model=128,
                       n_layer=4, n_head=4, n_kv_head=2, d_ff=352, norm_eps=1e-5,
                       rope_theta=10000.0),
}


# ----------------------------------------------------------------------------- safetensors

_DTYPES = {"F32": np.float32, "I32": np.int32, "F64": np.float64}


def read_safetensors(path):
    """Returns ({name: np.ndarray} in data order, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    out = {}
    for name, e in entries:
        lo, hi = e["data_offsets"]
        arr = np.frombuffer(data[lo:hi], dtype=np.dtype(_DTYPES[e["dtype"]]).newbyteorder("<"))
        out[name] = arr.reshape(e["shape"]).copy()
    return out, meta


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, np.ndarray of float32 or int32), written in that order."""
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    chunks, offset = [], 0
    for name, arr in tensors:
        if arr.dtype == np.float32:
            dtype = "F32"
        elif arr.dtype == np.int32:
            dtype = "I32"
        else:
            raise TypeError(f"{name}: unsupported dtype {arr.dtype}")
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad so the data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- the models


def layernorm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope(x, theta):
    """x [B, H, T, D]; rotates pairs (i, i + D/2) by the angle t * theta^(-2i/D)."""
    _, _, t_len, d = x.shape
    half = d // 2
    inv_freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    ang = torch.arange(t_len, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention(q, k, v):
    """q [B, Hq, T, D], k/v [B, Hkv, T, D]; causal softmax attention, GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=1)
    t_len, d = q.shape[2], q.shape[3]
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.ones(t_len, t_len, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def forward(cfg, p, tokens):
    """Logits [B, T, vocab_padded] of the model with parameters p (name -> tensor)."""
    gpt2 = cfg["family"] == "gpt2"
    bsz, t_len = tokens.shape
    C, H, Hkv = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"]
    D = C // H
    eps = cfg["norm_eps"]
    x = p["embedding.wte"][tokens]
    if gpt2:
        x = x + p["embedding.wpe"][:t_len]
    for l in range(cfg["n_layer"]):
        w = lambda n: p[f"block.{l}.{n}"]  # noqa: E731
        if gpt2:
            h = layernorm(x, w("ln1_w"), w("ln1_b"), eps)
            qkv = h @ w("qkv_w").T + w("qkv_b")
        else:
            h = rmsnorm(x, w("norm1_w"), eps)
            qkv = h @ w("qkv_w").T
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(bsz, t_len, H, D).transpose(1, 2)
        k = k.view(bsz, t_len, Hkv, D).transpose(1, 2)
        v = v.view(bsz, t_len, Hkv, D).transpose(1, 2)
        if not gpt2:
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        y = attention(q, k, v).transpose(1, 2).reshape(bsz, t_len, H * D)
        if gpt2:
            x = x + (y @ w("proj_w").T + w("proj_b"))
            h = layernorm(x, w("ln2_w"), w("ln2_b"), eps)
            h = gelu_tanh(h @ w("fc_w").T + w("fc_b"))
            x = x + (h @ w("fc2_w").T + w("fc2_b"))
        else:
            x = x + y @ w("proj_w").T
            h = rmsnorm(x, w("norm2_w"), eps)
            gate, up = (h @ w("w13").T).split([cfg["d_ff"], cfg["d_ff"]], dim=-1)
            x = x + (F.silu(gate) * up) @ w("w2").T
    if gpt2:
        h = layernorm(x, p["head.lnf_w"], p["head.lnf_b"], eps)
        return h @ p["embedding.wte"].T  # tied head
    h = rmsnorm(x, p["head.norm_w"], eps)
    return h @ p["head.head_w"].T


def loss_of(cfg, logits, targets):
    V = cfg["vocab"]  # padding columns take no part in the softmax
    return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


def lr_at(step):
    """tandem's lr_at (src/optim/optim.cpp): linear warm-up, cosine to lr * min_lr_ratio."""
    lr, warmup, total = OPTIM["lr"], OPTIM["warmup"], OPTIM["total"]
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    floor = lr * OPTIM["min_lr_ratio"]
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return floor + 0.5 * (lr - floor) * (1.0 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------- fixture


def make_fixture(name, tandem, out_dir, command):
    cfg = PRESETS[name]
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, name + ".safetensors")
        subprocess.run([tandem, "export", "--model", name, "--seed", str(SEED), "--out", weights],
                       check=True, stdout=subprocess.DEVNULL)
        init, meta = read_safetensors(weights)
    exported = json.loads(meta["model"])
    for key, value in cfg.items():
        ok = math.isclose(exported[key], value, rel_tol=1e-6) if isinstance(value, float) \
            else exported[key] == value
        if not ok:
            raise SystemExit(f"{name}: tandem exported {key}={exported[key]}, expected {value}")

    rng = np.random.RandomState(SEED)
    seq = rng.randint(0, 256, size=(B, T + 1)).astype(np.int32)
    tokens_np, targets_np = np.ascontiguousarray(seq[:, :T]), np.ascontiguousarray(seq[:, 1:])
    tokens = torch.from_numpy(tokens_np).long()
    targets = torch.from_numpy(targets_np).long()

    names = list(init.keys())  # tandem's unit / parameter order
    params = {n: torch.nn.Parameter(torch.from_numpy(init[n].astype(np.float64))) for n in names}

    # Forward and backward at the initial weights.
    logits = forward(cfg, params, tokens)
    loss = loss_of(cfg, logits, targets)
    loss.backward()
    grads = {n: params[n].grad.detach().clone() for n in names}
    for n in names:
        params[n].grad = None

    # 10 AdamW steps on the same batch. Weight decay on matrices and embeddings (every 2-D
    # parameter), not on norm weights and biases.
    decay = [params[n] for n in names if params[n].dim() >= 2]
    no_decay = [params[n] for n in names if params[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": OPTIM["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=OPTIM["lr"], betas=(OPTIM["beta1"], OPTIM["beta2"]), eps=OPTIM["eps"])
    losses = []
    for step in range(STEPS):
        for n in names:
            params[n].grad = None
        step_loss = loss_of(cfg, forward(cfg, params, tokens), targets)
        losses.append(step_loss.item())
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_([params[n] for n in names], max_norm=OPTIM["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
    assert abs(losses[0] - loss.item()) < 1e-12

    f32 = lambda t: t.detach().numpy().astype(np.float32)  # noqa: E731
    tensors = [("tokens", tokens_np), ("targets", targets_np), ("logits", f32(logits)),
               ("losses", np.array(losses, dtype=np.float32))]
    tensors += [("grad." + n, f32(grads[n])) for n in names]
    tensors += [("update." + n, f32(params[n].detach() - torch.from_numpy(
        init[n].astype(np.float64)))) for n in names if n.startswith(UPDATE_UNITS)]
    metadata = {
        "model": name,
        "seed": SEED,
        "batch": B,
        "seq": T,
        "steps": STEPS,
        "optim": json.dumps(OPTIM, sort_keys=True),
        "tokens": f"numpy.random.RandomState({SEED}).randint(0, 256, size=({B}, {T + 1})); "
                  "tokens = [:, :T], targets = [:, 1:]",
        "precision": "float64 reference, stored as float32",
        "loss": repr(loss.item()),
        "losses_f64": json.dumps(losses),
        "update_units": ",".join(u.rstrip(".") for u in UPDATE_UNITS),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "command": command,
    }
    path = os.path.join(out_dir, name + ".safetensors")
    write_safetensors(path, tensors, metadata)
    size = os.path.getsize(path)
    print(f"{name}: loss {loss.item():.6f} -> {losses[-1]:.6f} after {STEPS - 1} updates; "
          f"{len(names)} parameters; wrote {path} ({size / 1e6:.2f} MB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", required=True, help="path to the tandem binary")
    ap.add_argument("--out", required=True, help="directory to write the fixtures to")
    ap.add_argument("--models", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    args = ap.parse_args()
    torch.set_num_threads(1)  # a fixed reduction order: reruns give identical files
    os.makedirs(args.out, exist_ok=True)
    command = " ".join(["/usr/bin/python3", "tools/make_fixtures.py"] + sys.argv[1:])
    for name in args.models:
        make_fixture(name, args.tandem, args.out, command)


if __name__ == "__main__":
    main()
