#!/usr/bin/python3
"""Generate the PyTorch reference fixtures that tests/unit/test_fixtures.cpp compares against.

For each tiny preset (gpt2-tiny, llama-tiny, pythia-tiny) this script

  1. asks tandem for its initial weights (`tandem export --model NAME --seed 1234`),
  2. rebuilds the model independently in PyTorch, in float64,
  3. computes, on a fixed batch of B=2 sequences of T=24 byte tokens, the logits, the mean
     cross-entropy and the gradient of every parameter,
  4. runs 10 AdamW steps (torch.optim.AdamW + clip_grad_norm_) on that same batch, recording
     the loss before each update and the total change of the parameters of a few units,

and writes everything to OUT/<name>.safetensors (float32 / int32 tensors, string metadata).

gpt2-tiny and llama-tiny are written out in plain torch below (`forward`). pythia-tiny (GPT-NeoX)
is Hugging Face transformers' GPTNeoXForCausalLM (eager attention, float64) evaluated at
tandem's weights; the plain-torch GPT-NeoX below (`forward_neox`) only cross-checks it. Without
transformers, pythia-tiny is skipped (with a message and exit status 2) and the others are
still written.

Run with the interpreter that has torch (PyTorch >= 1.13, numpy; transformers for pythia-tiny):

    /usr/bin/python3 tools/make_fixtures.py --tandem build/tandem --out tests/fixtures
    python3 tools/make_fixtures.py --tandem build/tandem --out tests/fixtures --only pythia-tiny
"""

import argparse
import contextlib
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
    "pythia-tiny": dict(family="neox", vocab=256, vocab_padded=256, context=256, d_model=128,
                        n_layer=4, n_head=4, n_kv_head=4, d_ff=512, norm_eps=1e-5,
                        rope_theta=10000.0, rotary_pct=0.25),
}
# The family's description, as tandem exports it (src/model/config.cpp, model_config_to_json);
# checked where the export has the key. Other keys (init_std, ...) are ignored.
FAMILY_KEYS = {
    "neox": dict(norm="layernorm", mlp="gelu_erf", residual="parallel", bias=True,
                 tied_head=False, learned_positions=False),
}
# Presets whose reference is a Hugging Face transformers model (see HfNeox).
NEEDS_TRANSFORMERS = ("pythia-tiny",)


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
    if cfg["family"] == "neox":
        return forward_neox(cfg, p, tokens)
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


def rotary_dim(cfg):
    """Rotated channels per head: head_dim x rotary_pct rounded down to even (tandem's rule)."""
    r = int(cfg["d_model"] // cfg["n_head"] * cfg["rotary_pct"])
    return r - r % 2


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def forward_neox(cfg, p, tokens):
    """GPT-NeoX (Pythia) in plain torch, parameters in tandem's names and layout. Only a check
    of the transformers model that makes the pythia fixture (HfNeox): parallel residual
    x + attn(LN1(x)) + mlp(LN2(x)), biases everywhere, exact GELU, "rotate half" rope on the
    first rotary_dim channels of each q and k head, untied head, no learned positions."""
    bsz, t_len = tokens.shape
    C, H = cfg["d_model"], cfg["n_head"]
    D = C // H
    R = rotary_dim(cfg)
    eps = cfg["norm_eps"]

    def partial_rope(t):
        return torch.cat([rope(t[..., :R], cfg["rope_theta"]), t[..., R:]], dim=-1)

    x = p["embedding.wte"][tokens]
    for l in range(cfg["n_layer"]):
        w = lambda n: p[f"block.{l}.{n}"]  # noqa: E731
        h = layernorm(x, w("ln1_w"), w("ln1_b"), eps)
        qkv = h @ w("qkv_w").T + w("qkv_b")  # tandem's rows: all q heads, all k, all v
        q, k, v = (t.reshape(bsz, t_len, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
        y = attention(partial_rope(q), partial_rope(k), v).transpose(1, 2).reshape(bsz, t_len, C)
        a = y @ w("proj_w").T + w("proj_b")
        h = layernorm(x, w("ln2_w"), w("ln2_b"), eps)
        m = gelu_erf(h @ w("fc_w").T + w("fc_b")) @ w("fc2_w").T + w("fc2_b")
        x = x + a + m
    h = layernorm(x, p["head.lnf_w"], p["head.lnf_b"], eps)
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


# ----------------------------------------------------------------------------- GPT-NeoX: transformers


def import_transformers():
    """(the transformers module, None), or (None, why it does not import)."""
    try:
        import transformers
    except Exception as e:  # ImportError, or a broken install that fails on import
        return None, f"{type(e).__name__}: {e}"
    return transformers, None


def qkv_tandem_to_hf(t, H, D):
    """tandem's qkv rows, (3, H, D) = [all q heads | all k heads | all v heads], to transformers'
    per-head interleave (H, 3, D) = [q0 k0 v0 | q1 k1 v1 | ...]. The weight [3HD, C] or the bias
    [3HD]; differentiable."""
    rest = tuple(t.shape[1:])
    return t.reshape(3, H, D, *rest).transpose(0, 1).reshape(3 * H * D, *rest)


def qkv_hf_to_tandem(t, H, D):
    """The inverse of qkv_tandem_to_hf: (H, 3, D) rows back to (3, H, D)."""
    rest = tuple(t.shape[1:])
    return t.reshape(H, 3, D, *rest).transpose(0, 1).reshape(3 * H * D, *rest)


QKV = (".qkv_w", ".qkv_b")  # the tandem parameters whose rows qkv_tandem_to_hf permutes


def neox_hf_names(cfg):
    """tandem's parameter name -> GPTNeoXForCausalLM's, for every parameter."""
    names = {"embedding.wte": "gpt_neox.embed_in.weight"}
    for l in range(cfg["n_layer"]):
        for ours, theirs in (("ln1", "input_layernorm"), ("qkv", "attention.query_key_value"),
                             ("proj", "attention.dense"), ("ln2", "post_attention_layernorm"),
                             ("fc", "mlp.dense_h_to_4h"), ("fc2", "mlp.dense_4h_to_h")):
            names[f"block.{l}.{ours}_w"] = f"gpt_neox.layers.{l}.{theirs}.weight"
            names[f"block.{l}.{ours}_b"] = f"gpt_neox.layers.{l}.{theirs}.bias"
    names["head.lnf_w"] = "gpt_neox.final_layer_norm.weight"
    names["head.lnf_b"] = "gpt_neox.final_layer_norm.bias"
    names["head.head_w"] = "embed_out.weight"  # lm_head.weight from transformers 5 on (HfNeox)
    return names


def functional_call(module, params, args, kwargs):
    try:
        from torch.func import functional_call as call  # torch >= 2.0
    except ImportError:
        from torch.nn.utils.stateless import functional_call as call  # torch 1.12, 1.13
    return call(module, params, args, kwargs)


class HfNeox:
    """transformers' GPTNeoXForCausalLM for a neox preset, in float64, called like `forward`:
    hf(p, tokens) puts p (tandem's names and layout) in place of the model's parameters, the qkv
    rows permuted by qkv_tandem_to_hf, and returns the logits [B, T, vocab_padded],
    differentiable with respect to p (autograd carries the gradients back through the
    permutation, onto tandem's layout).

    transformers computes two things in float32 whatever the model's dtype: the rotary cos/sin
    (from float32 angles) and, in recent versions, the eager softmax (softmax(..., dtype=
    torch.float32)). Left alone they would make this reference fp32-accurate there (~1e-7, not
    far below tandem's own fp32 errors). So while the model runs, the rotary module's cos/sin
    are replaced by float64 values of the same shape, after checking that transformers' own agree
    with them (rotary_dim channels, base rope_theta, "rotate half" layout) to fp32 accuracy, and a
    softmax asked to compute a float64 input in float32 computes it in float64. The model's
    arithmetic is otherwise transformers' own."""

    def __init__(self, name, cfg, transformers):
        self.name, self.cfg, self.tf = name, cfg, transformers
        self.H = cfg["n_head"]
        self.D = cfg["d_model"] // self.H
        self.R = rotary_dim(cfg)
        self.names = neox_hf_names(cfg)
        self.rotary_calls = 0
        self.rotary_dev = 0.0  # largest |transformers' cos/sin - float64 cos/sin| seen
        self.softmax_upcasts = 0  # fp32 softmaxes of float64 inputs computed in float64
        config = self._config()
        model = transformers.GPTNeoXForCausalLM(config)
        if getattr(model.config, "_attn_implementation", "eager") != "eager":
            if hasattr(model, "set_attn_implementation"):
                model.set_attn_implementation("eager")
            else:
                model.config._attn_implementation = "eager"
        self._fail_unless(getattr(model.config, "_attn_implementation", "eager") == "eager",
                          "the model does not use eager attention: "
                          f"{getattr(model.config, '_attn_implementation', None)}")
        model.double()
        model.eval()  # no dropout (its rates are 0 anyway)
        self.model = model
        # The head's name: embed_out before transformers 5, lm_head after.
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        by_id = {id(t): n for n, t in model.named_parameters()}
        if head is not None and id(head.weight) in by_id:
            self.names["head.head_w"] = by_id[id(head.weight)]
        self._check_model()
        self._patch_rotary()

    def _fail_unless(self, ok, what):
        if not ok:
            raise SystemExit(f"{self.name}: transformers {self.tf.__version__}: {what}")

    def _config(self):
        cfg = self.cfg
        theta, pct = float(cfg["rope_theta"]), float(cfg["rotary_pct"])
        base = dict(vocab_size=cfg["vocab_padded"], hidden_size=cfg["d_model"],
                    num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"],
                    intermediate_size=cfg["d_ff"], hidden_act="gelu",
                    max_position_embeddings=cfg["context"], layer_norm_eps=cfg["norm_eps"],
                    use_parallel_residual=True, tie_word_embeddings=False, attention_bias=True,
                    attention_dropout=0.0, hidden_dropout=0.0, use_cache=False,
                    attn_implementation="eager",
                    rotary_pct=pct, rotary_emb_base=theta)  # transformers 4.x's rotary names
        newer = dict(rope_theta=theta, partial_rotary_factor=pct)  # 4.4x-4.5x attributes
        rope_parameters = dict(rope_type="default", rope_theta=theta,
                               partial_rotary_factor=pct)  # transformers 5
        # Every spelling at once where the version takes them (they all say the same), fewer
        # where it refuses some; the checks below and the rotary check decide.
        errors = []
        for extra in (dict(newer, rope_parameters=rope_parameters),
                      dict(rope_parameters=rope_parameters), newer, {}):
            try:
                config = self.tf.GPTNeoXConfig(**base, **extra)
                break
            except Exception as e:
                errors.append(f"with {sorted(extra) or 'no extra keys'}: {type(e).__name__}: {e}")
        else:
            self._fail_unless(False, "GPTNeoXConfig refused every spelling of the rotary "
                              "settings:\n  " + "\n  ".join(errors))
        try:
            config._attn_implementation = "eager"
        except Exception:
            pass  # transformers < 4.36 has only eager attention for GPT-NeoX
        for key, want in (("rotary_pct", pct), ("partial_rotary_factor", pct),
                          ("rotary_emb_base", theta), ("rope_theta", theta)):
            got = getattr(config, key, None)
            self._fail_unless(got is None or math.isclose(float(got), want),
                              f"config.{key} = {got}, expected {want}")
        for key in ("rope_parameters", "rope_scaling"):
            rp = getattr(config, key, None)
            if isinstance(rp, dict):
                kind = rp.get("rope_type", rp.get("type", "default"))
                self._fail_unless(kind == "default", f"config.{key} = {rp}: not plain rope")
                for k, want in (("rope_theta", theta), ("partial_rotary_factor", pct)):
                    self._fail_unless(k not in rp or math.isclose(float(rp[k]), want),
                                      f"config.{key}[{k!r}] = {rp[k]}, expected {want}")
            else:
                self._fail_unless(rp is None, f"config.{key} = {rp!r}: not plain rope")
        return config

    def _check_model(self):
        """The parts of the architecture that a configuration slip would change silently (the
        rotary settings are checked where the model uses them, in _float64_rotary)."""
        m = self.model
        got = {n: tuple(t.shape) for n, t in m.named_parameters()}
        want = set(self.names.values())
        self._fail_unless(len(want) == len(self.names), "the head is tied to the embedding")
        self._fail_unless(set(got) == want,
                          f"GPTNeoXForCausalLM's parameters {sorted(set(got) - want)} are not "
                          f"tandem's and {sorted(want - set(got))} are missing (a tied head is "
                          "listed once)")
        layers = list(m.gpt_neox.layers)
        self._fail_unless(len(layers) == self.cfg["n_layer"], f"{len(layers)} layers")
        x = torch.linspace(-6.0, 6.0, 241, dtype=torch.float64)
        for i, layer in enumerate(layers):
            self._fail_unless(getattr(layer, "use_parallel_residual", True),
                              f"layer {i} has a sequential residual")
            for ln in (layer.input_layernorm, layer.post_attention_layernorm):
                self._fail_unless(math.isclose(ln.eps, self.cfg["norm_eps"]), f"LayerNorm eps {ln.eps}")
            rot = getattr(layer.attention, "rotary_ndims", self.R)
            self._fail_unless(rot == self.R, f"layer {i} rotates {rot} channels, not {self.R}")
            dev = (layer.mlp.act(x) - gelu_erf(x)).abs().max().item()
            self._fail_unless(dev < 1e-12, f"the MLP activation is not the exact GELU ({dev:.1e})")

    def check_export(self, init):
        """tandem's exported tensors are exactly the model's parameters, shapes included."""
        shapes = {n: tuple(t.shape) for n, t in self.model.named_parameters()}
        self._fail_unless(set(init) == set(self.names),
                          f"tandem exported {sorted(set(init) - set(self.names))} beyond the "
                          f"GPT-NeoX parameters and lacks {sorted(set(self.names) - set(init))}")
        for ours, theirs in self.names.items():
            self._fail_unless(tuple(init[ours].shape) == shapes[theirs],
                              f"{ours} {tuple(init[ours].shape)} vs {theirs} {shapes[theirs]}")

    # -- precision: float64 where transformers computes in float32

    def _cos_sin(self, shape, pos):
        """float64 cos/sin of the shape transformers returned, [..., T, rotary_dim]: angle
        pos * theta^(-2i/rotary_dim) for i < rotary_dim/2, repeated for the second half."""
        self._fail_unless(shape[-1] == self.R,
                          f"the rotary embedding covers {shape[-1]} channels per head, tandem's "
                          f"rotary_dim is {self.R} (rotary_pct {self.cfg['rotary_pct']} of "
                          f"{self.D}): the config's rotary setting was not taken")
        lead = shape[:-1]
        if pos is None:  # transformers < 4.45: positions 0 .. seq_len-1
            pos = torch.arange(lead[-1])
        pos = pos.to(torch.float64).expand(lead)
        inv_freq = float(self.cfg["rope_theta"]) ** (
            -torch.arange(0, self.R, 2, dtype=torch.float64) / self.R)
        ang = pos[..., None] * inv_freq
        emb = torch.cat([ang, ang], dim=-1)
        return torch.cos(emb), torch.sin(emb)

    def _float64_rotary(self, original):
        def rotary(x, *args, **kwargs):
            cos, sin = original(x, *args, **kwargs)
            pos = kwargs.get("position_ids", args[0] if args else None)
            if not (torch.is_tensor(pos) and not pos.is_floating_point()):
                pos = None  # older versions pass seq_len (or nothing) instead
            cos64, sin64 = self._cos_sin(tuple(cos.shape), pos)
            dev = max((cos.double() - cos64).abs().max().item(),
                      (sin.double() - sin64).abs().max().item())
            # fp32 angles up to ~T rad are off by ~T * 6e-8; a wrong base or layout by > 1e-2.
            self._fail_unless(dev < 1e-5, f"its rotary cos/sin differ from rope with base "
                              f"{self.cfg['rope_theta']} on {self.R} channels by {dev:.2e}")
            self.rotary_dev = max(self.rotary_dev, dev)
            self.rotary_calls += 1
            return cos64, sin64
        return rotary

    def _patch_rotary(self):
        mods = [m for m in self.model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
        self._fail_unless(bool(mods), "found no *RotaryEmbedding module in GPTNeoXForCausalLM")
        for mod in mods:
            mod.forward = self._float64_rotary(mod.forward)

    @contextlib.contextmanager
    def _float64_softmax(self):
        original = torch.nn.functional.softmax

        def softmax(input, dim=None, _stacklevel=3, dtype=None):
            if dtype is not None and dtype != torch.float64 and input.dtype == torch.float64:
                self.softmax_upcasts += 1
                dtype = torch.float64
            return original(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

        torch.nn.functional.softmax = softmax
        try:
            yield
        finally:
            torch.nn.functional.softmax = original

    # -- evaluation

    def hf_params(self, p):
        """tandem's parameters p under transformers' names, in its qkv layout."""
        return {theirs: qkv_tandem_to_hf(p[ours], self.H, self.D) if ours.endswith(QKV)
                else p[ours] for ours, theirs in self.names.items()}

    def run(self, hf_params, tokens):
        """Logits at hf_params (transformers' names), or at the model's own parameters (None)."""
        calls = self.rotary_calls
        with self._float64_softmax():
            if hf_params is None:
                out = self.model(tokens, use_cache=False)
            else:
                out = functional_call(self.model, hf_params, (tokens,), {"use_cache": False})
        logits = out.logits if hasattr(out, "logits") else out[0]
        self._fail_unless(self.rotary_calls > calls, "the forward never called the rotary "
                          "module that was checked")
        self._fail_unless(logits.dtype == torch.float64, f"logits in {logits.dtype}")
        self._fail_unless(tuple(logits.shape) == (*tokens.shape, self.cfg["vocab_padded"]),
                          f"logits of shape {tuple(logits.shape)}")
        return logits

    def __call__(self, p, tokens):
        return self.run(self.hf_params(p), tokens)

    def explicit_grads(self, init, tokens, targets):
        """Logits and gradients the ordinary way: tandem's weights copied into the model's own
        parameters (qkv rows permuted), backward, the gradients mapped back to tandem's names,
        the qkv ones by the inverse permutation qkv_hf_to_tandem. A check of __call__."""
        own = dict(self.model.named_parameters())
        weights = {n: torch.from_numpy(a.astype(np.float64)) for n, a in init.items()}
        with torch.no_grad():
            for theirs, t in self.hf_params(weights).items():
                own[theirs].copy_(t)
                own[theirs].grad = None
        logits = self.run(None, tokens)
        loss_of(self.cfg, logits, targets).backward()
        grads = {}
        for ours, theirs in self.names.items():
            g = own[theirs].grad.detach()
            grads[ours] = (qkv_hf_to_tandem(g, self.H, self.D) if ours.endswith(QKV) else g).clone()
        return logits.detach(), grads


def rel_err(a, b):
    """||a - b|| / ||b||, normwise, float64."""
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def neox_cross_checks(hf, cfg, init, names, tokens, targets, logits, grads, losses, params):
    """Checks the transformers reference two ways; returns metadata.

    1. qkv layout: the gradients taken through the model's own parameters and mapped back by
       the inverse permutation equal the ones autograd carried through the forward permutation.
    2. architecture: an independent plain-torch GPT-NeoX (forward_neox) gives the same logits,
       gradients, training losses and updates. float64 against float64: ~1e-13 when both are
       right; a wrong rope (base, width, layout), residual, GELU or head mapping is >= 1e-4."""
    H, D = hf.H, hf.D
    x = torch.randn(3 * H * D, 5, dtype=torch.float64)
    assert torch.equal(qkv_hf_to_tandem(qkv_tandem_to_hf(x, H, D), H, D), x)
    assert not torch.equal(qkv_tandem_to_hf(x, H, D), x)

    ex_logits, ex_grads = hf.explicit_grads(init, tokens, targets)
    inverse = max([rel_err(ex_logits, logits.detach())] +
                  [rel_err(ex_grads[n], grads[n]) for n in names])
    hf._fail_unless(inverse < 1e-12, f"the gradients through the model's own parameters, mapped "
                    f"back by qkv_hf_to_tandem, differ from autograd's by {inverse:.2e}")

    p = {n: torch.nn.Parameter(torch.from_numpy(init[n].astype(np.float64))) for n in names}
    pt_logits = forward_neox(cfg, p, tokens)
    loss_of(cfg, pt_logits, targets).backward()
    dev = {"logits": rel_err(pt_logits.detach(), logits.detach())}
    worst = max((rel_err(p[n].grad, grads[n]), n) for n in names)
    dev["grad"], dev["grad_worst"] = worst
    for n in names:
        p[n].grad = None
    pt_losses = train(cfg, lambda q, t: forward_neox(cfg, q, t), p, names, tokens, targets)
    dev["losses"] = max(abs(a - b) / abs(b) for a, b in zip(pt_losses, losses))
    worst = max((rel_err(p[n].detach() - torch.from_numpy(init[n].astype(np.float64)),
                         params[n].detach() - torch.from_numpy(init[n].astype(np.float64))), n)
                for n in names)
    dev["update"], dev["update_worst"] = worst
    largest = max(v for v in dev.values() if isinstance(v, float))
    report = ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"({v})" for k, v in dev.items())
    hf._fail_unless(largest < 1e-6, "GPTNeoXForCausalLM and the plain-torch GPT-NeoX disagree "
                    f"(relative): {report}. One of them does not compute tandem's architecture")
    if largest > 1e-10:
        print(f"{hf.name}: warning: transformers and the plain-torch GPT-NeoX agree only to "
              f"{largest:.1e} (float64 gives ~1e-13; some float32 step remains?): {report}",
              file=sys.stderr)
    return {
        "reference": f"transformers {hf.tf.__version__} GPTNeoXForCausalLM, eager attention, "
                     "float64 (rotary cos/sin and softmax in float64 too); tandem's qkv rows "
                     "(3, H, D) -> transformers' (H, 3, D) and back for the gradients",
        "transformers": hf.tf.__version__,
        "python": f"{sys.executable} {sys.version.split()[0]}",
        "check_plain_torch": json.dumps(dev, sort_keys=True),
        "check_qkv_inverse": repr(inverse),
        "rotary_fp32_dev": repr(hf.rotary_dev),
        "softmax_fp32_redone_f64": str(hf.softmax_upcasts),
    }


# ----------------------------------------------------------------------------- fixture


def train(cfg, fwd, params, names, tokens, targets):
    """STEPS AdamW steps on the same batch, params (name -> leaf) updated in place; returns the
    loss before each update. Weight decay on matrices and embeddings (every 2-D parameter), not
    on norm weights and biases."""
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
        step_loss = loss_of(cfg, fwd(params, tokens), targets)
        losses.append(step_loss.item())
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_([params[n] for n in names], max_norm=OPTIM["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
    return losses


def make_fixture(name, tandem, out_dir, command, transformers=None):
    cfg = PRESETS[name]
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, name + ".safetensors")
        subprocess.run([tandem, "export", "--model", name, "--seed", str(SEED), "--out", weights],
                       check=True, stdout=subprocess.DEVNULL)
        init, meta = read_safetensors(weights)
    exported = json.loads(meta["model"])
    family_keys = FAMILY_KEYS.get(cfg["family"], {})
    for key, value in {**cfg, **family_keys}.items():
        if key not in exported:
            if key in family_keys:
                continue  # an older export without the family description
            raise SystemExit(f"{name}: tandem's export has no {key} (expected {value})")
        ok = math.isclose(exported[key], value, rel_tol=1e-6) if isinstance(value, float) \
            else exported[key] == value
        if not ok:
            raise SystemExit(f"{name}: tandem exported {key}={exported[key]}, expected {value}")

    # The reference: this script's own model, or transformers' for GPT-NeoX.
    if name in NEEDS_TRANSFORMERS:
        hf = HfNeox(name, cfg, transformers)
        hf.check_export(init)
        fwd = hf
    else:
        hf = None
        fwd = lambda p, t: forward(cfg, p, t)  # noqa: E731

    rng = np.random.RandomState(SEED)
    seq = rng.randint(0, 256, size=(B, T + 1)).astype(np.int32)
    tokens_np, targets_np = np.ascontiguousarray(seq[:, :T]), np.ascontiguousarray(seq[:, 1:])
    tokens = torch.from_numpy(tokens_np).long()
    targets = torch.from_numpy(targets_np).long()

    names = list(init.keys())  # tandem's unit / parameter order
    params = {n: torch.nn.Parameter(torch.from_numpy(init[n].astype(np.float64))) for n in names}

    # Forward and backward at the initial weights.
    logits = fwd(params, tokens)
    loss = loss_of(cfg, logits, targets)
    loss.backward()
    grads = {n: params[n].grad.detach().clone() for n in names}
    for n in names:
        params[n].grad = None

    # 10 AdamW steps on the same batch.
    losses = train(cfg, fwd, params, names, tokens, targets)
    assert abs(losses[0] - loss.item()) < 1e-12

    checks = {} if hf is None else neox_cross_checks(hf, cfg, init, names, tokens, targets,
                                                     logits, grads, losses, params)

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
        **checks,
        "command": command,
    }
    path = os.path.join(out_dir, name + ".safetensors")
    write_safetensors(path, tensors, metadata)
    size = os.path.getsize(path)
    print(f"{name}: loss {loss.item():.6f} -> {losses[-1]:.6f} after {STEPS - 1} updates; "
          f"{len(names)} parameters; wrote {path} ({size / 1e6:.2f} MB)")
    if checks:
        print(f"{name}: transformers {checks['transformers']} vs plain torch: "
              f"{checks['check_plain_torch']}; qkv inverse {float(checks['check_qkv_inverse']):.1e}; "
              f"fp32 rotary off by {hf.rotary_dev:.1e}, {hf.softmax_upcasts} fp32 softmaxes "
              "redone in float64")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", required=True, help="path to the tandem binary")
    ap.add_argument("--out", required=True, help="directory to write the fixtures to")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--models", nargs="+", default=list(PRESETS), choices=list(PRESETS),
                       help="presets to generate (default: all)")
    which.add_argument("--only", metavar="NAME", choices=list(PRESETS),
                       help="generate this one preset (one of %(choices)s)")
    args = ap.parse_args()
    models = [args.only] if args.only else args.models
    torch.set_num_threads(1)  # a fixed reduction order: reruns give identical files
    os.makedirs(args.out, exist_ok=True)
    command = " ".join(["/usr/bin/python3", "tools/make_fixtures.py"] + sys.argv[1:])
    transformers = None
    need = [n for n in models if n in NEEDS_TRANSFORMERS]
    if need:
        transformers, why = import_transformers()
        if transformers is None:
            print(f"make_fixtures: {', '.join(need)} needs Hugging Face transformers (its reference "
                  f"is transformers' GPTNeoXForCausalLM), which does not import here ({why}). "
                  f"Skipping {', '.join(need)}; the other presets are still written. Install "
                  f"transformers or run on a machine that has it: "
                  f"python3 tools/make_fixtures.py --tandem ... --out tests/fixtures --only {need[0]}",
                  file=sys.stderr)
    skipped = []
    for name in models:
        if name in NEEDS_TRANSFORMERS and transformers is None:
            skipped.append(name)
            continue
        make_fixture(name, args.tandem, args.out, command, transformers)
    if skipped:
        print(f"make_fixtures: NOT written (they need transformers): {', '.join(skipped)}",
              file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
