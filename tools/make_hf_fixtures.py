#!/usr/bin/env python3
"""Tiny Hugging Face checkpoints with float64 references, for tandem's import/export tests.

For each model below this script

  1. builds a randomly initialised transformers model (GPT2LMHeadModel, LlamaForCausalLM,
     GPTNeoXForCausalLM) from a config whose every field is checked after construction, with
     large, seeded initial values (matrices N(0, 0.2^2), norm weights 1 + 0.1 N(0,1), biases
     0.1 N(0,1)) so that a wrong mapping of any tensor changes the result,
  2. rounds it to the dtype it is stored in and saves it with save_pretrained (safetensors,
     config.json, generation_config.json; one variant in >= 3 shards with an index),
  3. loads the saved directory back in float64 (checking that every stored tensor arrived,
     value for value) and, on a fixed batch of 2 x 16 tokens, computes the logits, the mean
     cross-entropy, the gradient norm and ONE AdamW step (clip_grad_norm_ 1.0 first), all in
     float64, with transformers' float32 islands (rotary cos/sin, RMSNorm, the eager softmax)
     recomputed in float64 after checking transformers' own values against them,
  4. cross-checks that against a plain-torch forward written here (logits, gradients, step),
  5. writes OUT/<name>.reference.safetensors beside OUT/<name>/.

Other modes:

    --check-load DIR... --reference FILE   load each DIR with AutoModelForCausalLM (no missing,
                                           unexpected or mismatched key allowed), run the
                                           reference's tokens, compare with its logits
    --self-check                           test this script's own pieces (needs torch only)

Run (PyTorch 2.x, numpy, transformers 4.4x or 5.x; no network is needed):

    python3 tools/make_hf_fixtures.py --out tests/fixtures/hf
    python3 tools/make_hf_fixtures.py --self-check
    python3 tools/make_hf_fixtures.py --check-load /tmp/exported-gpt2 \\
        --reference tests/fixtures/hf/gpt2.reference.safetensors
"""

import argparse
import contextlib
import dataclasses
import inspect
import json
import logging
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import warnings

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import (attention, gelu_erf, gelu_tanh, import_transformers,  # noqa: E402
                           layernorm, rel_err, rmsnorm, rope, write_safetensors)
from make_fixtures import forward as mf_forward  # noqa: E402

SEED = 1234
B, T = 2, 16
VOCAB = 300
BOS, EOS = 1, 2
# Initial values (drawn here, in parameter order, from a generator seeded per model).
INIT = dict(matrix_std=0.2, norm_weight="1 + 0.1 * N(0, 1)", bias="0.1 * N(0, 1)")
# The one training step. clip_eps is clip_grad_norm_'s: coef = max_norm / (norm + 1e-6).
OPTIM = dict(optimizer="torch.optim.AdamW", lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, weight_decay_on="tensors of >= 2 dims (0 on the others)",
             grad_clip=1.0, clip_eps=1e-6, steps=1)
# The float32 unit roundoff: the reference is stored in float32.
U32 = 2.0 ** -24

GPT2 = dict(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, n_inner=None,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            layer_norm_epsilon=1e-5, scale_attn_weights=True,
            scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
            tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS)
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=64, rms_norm_eps=1e-5, hidden_act="silu",
             attention_bias=False, mlp_bias=False, attention_dropout=0.0, pretraining_tp=1,
             tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS)
NEOX = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=256, hidden_act="gelu", max_position_embeddings=64,
            layer_norm_eps=1e-5, use_parallel_residual=True, attention_bias=True,
            attention_dropout=0.0, hidden_dropout=0.0, tie_word_embeddings=False,
            bos_token_id=BOS, eos_token_id=EOS)

# name -> what to build. arch: the numbers the plain-torch check and the float64 patches use
# (written out here, not read back from transformers' config).
MODELS = {
    "gpt2": dict(family="gpt2", model_cls="GPT2LMHeadModel", config_cls="GPT2Config",
                 dtype="float32", seed=SEED, config=GPT2, rope=None, shard=None,
                 arch=dict(L=2, C=64, H=4, Hkv=4, D=16, F=256, eps=1e-5, tied=True)),
    "llama": dict(family="llama", model_cls="LlamaForCausalLM", config_cls="LlamaConfig",
                  dtype="float32", seed=SEED + 1, config=LLAMA,
                  rope=dict(theta=500000.0, pct=1.0), shard=None,
                  arch=dict(L=2, C=64, H=4, Hkv=2, D=16, F=176, eps=1e-5, tied=False)),
    "llama-tied-bf16-sharded": dict(
        family="llama", model_cls="LlamaForCausalLM", config_cls="LlamaConfig",
        dtype="bfloat16", seed=SEED + 2, config=dict(LLAMA, tie_word_embeddings=True),
        rope=dict(theta=10000.0, pct=1.0), shard=60_000,
        arch=dict(L=2, C=64, H=4, Hkv=2, D=16, F=176, eps=1e-5, tied=True)),
    "neox": dict(family="neox", model_cls="GPTNeoXForCausalLM", config_cls="GPTNeoXConfig",
                 dtype="float32", seed=SEED + 3, config=NEOX,
                 rope=dict(theta=10000.0, pct=0.25), shard=None,
                 arch=dict(L=2, C=64, H=4, Hkv=4, D=16, F=256, eps=1e-5, tied=False)),
    "neox-fp16": dict(family="neox", model_cls="GPTNeoXForCausalLM", config_cls="GPTNeoXConfig",
                      dtype="float16", seed=SEED + 4, config=NEOX,
                      rope=dict(theta=10000.0, pct=0.25), shard=None,
                      arch=dict(L=2, C=64, H=4, Hkv=4, D=16, F=256, eps=1e-5, tied=False)),
}
MIN_SHARDS = 3
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ST_NAMES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
UNIT_ROUNDOFF = {"F32": 2.0 ** -24, "BF16": 2.0 ** -8, "F16": 2.0 ** -11}


class Failure(Exception):
    """A check did not hold; the message says which."""


def fail_unless(ok, what):
    if not ok:
        raise Failure(what)


def rotary_dims(arch, rope_cfg):
    """Rotated channels per head: head_dim x fraction, rounded down to even."""
    r = int(arch["D"] * rope_cfg["pct"])
    return r - r % 2


# ----------------------------------------------------------------------------- safetensors


def read_safetensors_any(path):
    """({name: np.ndarray}, {name: dtype string}, metadata) of a safetensors file; floating
    tensors (F64/F32/F16/BF16) come back as float64 (exactly), integers as int64. The header's
    offsets must tile the data exactly."""
    with open(path, "rb") as f:
        blob = f.read()
    fail_unless(len(blob) >= 8, f"{path}: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", blob[:8])
    fail_unless(8 + n <= len(blob), f"{path}: header length {n} past the end of the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    tensors, dtypes, end = {}, {}, 0
    for name, e in entries:
        lo, hi = e["data_offsets"]
        fail_unless(lo == end, f"{path}: {name} starts at {lo}, the previous tensor ends at {end}")
        end = hi
        raw = bytes(data[lo:hi])
        dt, shape = e["dtype"], tuple(e["shape"])
        if dt == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)
            arr = bits.view(np.float32).astype(np.float64)
        elif dt in ("F64", "F32", "F16"):
            arr = np.frombuffer(raw, dtype={"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dt])
            arr = arr.astype(np.float64)
        elif dt in ("I32", "I64"):
            arr = np.frombuffer(raw, dtype={"I32": "<i4", "I64": "<i8"}[dt]).astype(np.int64)
        else:
            raise Failure(f"{path}: {name} has dtype {dt}, which this reader does not take")
        fail_unless(arr.size == int(np.prod(shape, dtype=np.int64)),
                    f"{path}: {name} holds {arr.size} values for shape {list(shape)}")
        tensors[name] = arr.reshape(shape)
        dtypes[name] = dt
    fail_unless(end == len(data), f"{path}: {len(data) - end} bytes after the last tensor")
    return tensors, dtypes, meta


def saved_tensors(directory):
    """The tensors of a save_pretrained directory: one model.safetensors, or the shards that
    model.safetensors.index.json lists (every shard file listed, every tensor in its shard)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.exists(index):
        fail_unless(not os.path.exists(single), f"{directory}: both an index and model.safetensors")
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        shards = sorted(set(weight_map.values()))
        tensors, dtypes = {}, {}
        for shard in shards:
            t, d, _ = read_safetensors_any(os.path.join(directory, shard))
            for name in t:
                fail_unless(weight_map.get(name) == shard,
                            f"{directory}: {name} is in {shard}, the index says "
                            f"{weight_map.get(name)}")
            fail_unless(not set(t) & set(tensors), f"{directory}: {sorted(set(t) & set(tensors))} "
                        "in two shards")
            tensors.update(t)
            dtypes.update(d)
        fail_unless(set(tensors) == set(weight_map),
                    f"{directory}: the index lists {sorted(set(weight_map) - set(tensors))} "
                    "which no shard holds")
        return tensors, dtypes, shards
    fail_unless(os.path.exists(single), f"{directory}: neither model.safetensors nor an index")
    tensors, dtypes, _ = read_safetensors_any(single)
    return tensors, dtypes, ["model.safetensors"]


# ----------------------------------------------------------------------------- the training step


def clip_grads_replica(grads, max_norm, clip_eps):
    """clip_grad_norm_ written out: (the total 2-norm before clipping, the clipped grads)."""
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    coef = min(1.0, max_norm / (total.item() + clip_eps))
    return total.item(), [g * coef for g in grads]


def adamw_first_step_replica(params, grads, optim):
    """The first AdamW step from a zero state, written out (torch.optim.AdamW's formula):
    p * (1 - lr * wd) - lr / (1 - b1) * m / (sqrt(v) / sqrt(1 - b2) + eps), m = (1 - b1) g,
    v = (1 - b2) g^2; wd only for tensors of >= 2 dims."""
    lr, b1, b2, eps = optim["lr"], optim["beta1"], optim["beta2"], optim["eps"]
    out = []
    for p, g in zip(params, grads):
        wd = optim["weight_decay"] if p.dim() >= 2 else 0.0
        m = (1 - b1) * g
        v = (1 - b2) * g * g
        denom = torch.sqrt(v) / math.sqrt(1 - b2) + eps
        out.append(p * (1 - lr * wd) - (lr / (1 - b1)) * m / denom)
    return out


def torch_train_step(params, optim):
    """clip_grad_norm_ then one torch.optim.AdamW step on params (their .grad set); returns
    the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=optim["grad_clip"])
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [g for g in ({"params": decay, "weight_decay": optim["weight_decay"]},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    opt = torch.optim.AdamW(groups, lr=optim["lr"], betas=(optim["beta1"], optim["beta2"]),
                            eps=optim["eps"])
    opt.step()
    return float(norm)


# ----------------------------------------------------------------------------- float64 transformers


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _fname(func):
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


try:
    from torch.overrides import TorchFunctionMode
except ImportError:  # torch < 1.13
    TorchFunctionMode = None


class Float64Patches:
    """Makes a float64 transformers model compute in float64 throughout.

    transformers computes some things in float32 whatever the model's dtype: the rotary
    cos/sin (float32 angles), RMSNorm (hidden_states.to(torch.float32)) and the eager softmax
    (softmax(..., dtype=torch.float32)). Here each *RotaryEmbedding module returns float64
    cos/sin of the shape transformers returned, each *RMSNorm module a float64 RMSNorm, after
    checking transformers' own result against them (a wrong base, width, layout or eps differs
    by far more than float32 rounding), and a softmax asked to compute a float64 input in
    float32 computes it in float64. While `active()`, a TorchFunctionMode watches every torch
    call outside those checked spots: one that turns a float64 input into a lower-precision
    output fails the run (the list of such calls is in the message)."""

    def __init__(self, name, model, spec, guard=True):
        self.name, self.spec, self.arch = name, spec, spec["arch"]
        self.rope = spec["rope"]
        self.R = rotary_dims(self.arch, self.rope) if self.rope else 0
        self.guard = guard
        self.allow = 0  # > 0 while a checked original runs
        self.rotary_calls = self.rms_calls = self.softmax_upcasts = 0
        self.rotary_dev = 0.0  # largest |transformers' cos/sin - float64 cos/sin|
        self.rms_dev = 0.0  # largest relative |transformers' RMSNorm - float64 RMSNorm|
        self.downcasts = []  # unchecked float64 -> lower precision calls
        self.fresh = set()  # lower-precision results of no float64 input (e.g. constants)
        rot = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
        if self.rope:
            fail_unless(bool(rot), f"{name}: no *RotaryEmbedding module in {type(model).__name__}")
        for m in rot:
            m.forward = self._rotary(m.forward)
        norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
        if spec["family"] == "llama":
            want = 2 * self.arch["L"] + 1
            fail_unless(len(norms) == want, f"{name}: {len(norms)} *RMSNorm modules, expected {want}")
        for m in norms:
            m.forward = self._rmsnorm(m, m.forward)

    @contextlib.contextmanager
    def _allowed(self):
        self.allow += 1
        try:
            yield
        finally:
            self.allow -= 1

    def _cos_sin(self, shape, pos):
        """float64 cos/sin [..., T, R]: angle pos * theta^(-2i/R) for i < R/2, repeated for the
        second half ("rotate half" layout)."""
        fail_unless(shape[-1] == self.R,
                    f"{self.name}: the rotary embedding covers {shape[-1]} channels per head, "
                    f"expected {self.R} ({self.rope['pct']} of {self.arch['D']}): the config's "
                    "rotary setting was not taken")
        lead = shape[:-1]
        if pos is None:  # older versions: positions 0 .. seq_len-1
            pos = torch.arange(lead[-1])
        pos = pos.to(torch.float64).expand(lead)
        inv_freq = float(self.rope["theta"]) ** (
            -torch.arange(0, self.R, 2, dtype=torch.float64) / self.R)
        ang = pos[..., None] * inv_freq
        emb = torch.cat([ang, ang], dim=-1)
        return torch.cos(emb), torch.sin(emb)

    def _rotary(self, original):
        def rotary(x, *args, **kwargs):
            with self._allowed():
                cos, sin = original(x, *args, **kwargs)
            pos = kwargs.get("position_ids", args[0] if args else None)
            if not (torch.is_tensor(pos) and not pos.is_floating_point()):
                pos = None  # older versions pass seq_len (or nothing) instead
            cos64, sin64 = self._cos_sin(tuple(cos.shape), pos)
            dev = max((cos.double() - cos64).abs().max().item(),
                      (sin.double() - sin64).abs().max().item())
            # float32 angles up to ~T rad are off by ~T * 6e-8; a wrong base or layout by > 1e-2
            fail_unless(dev < 1e-5, f"{self.name}: transformers' rotary cos/sin differ from rope "
                        f"with base {self.rope['theta']} on {self.R} channels by {dev:.2e}")
            self.rotary_dev = max(self.rotary_dev, dev)
            self.rotary_calls += 1
            return cos64.to(x.dtype), sin64.to(x.dtype)
        return rotary

    def _rmsnorm(self, module, original):
        eps = self.arch["eps"]
        got = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        fail_unless(got is not None and math.isclose(float(got), eps),
                    f"{self.name}: {type(module).__name__} eps {got}, expected {eps}")

        def rms(hidden_states, *args, **kwargs):
            with self._allowed():
                out = original(hidden_states, *args, **kwargs)
            x = hidden_states
            ours = module.weight * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))
            dev = ((out.double() - ours).abs().max() / ours.abs().max().clamp_min(1e-300)).item()
            fail_unless(dev < 1e-5, f"{self.name}: transformers' {type(module).__name__} differs "
                        f"from w * x / sqrt(mean(x^2) + {eps}) by {dev:.2e} (relative)")
            self.rms_dev = max(self.rms_dev, dev)
            self.rms_calls += 1
            return ours
        return rms

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

    def _mode(self):
        owner = self

        class Guard(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if not owner.allow:
                    low = [t.dtype for t in _tensors(out)
                           if t.is_floating_point() and t.dtype != torch.float64]
                    if low:
                        if any(t.is_floating_point() and t.dtype == torch.float64
                               for t in _tensors((args, kwargs))):
                            owner.downcasts.append(f"{_fname(func)} -> {low[0]}")
                        else:
                            owner.fresh.add(f"{_fname(func)} -> {low[0]}")
                return out
        return Guard()

    @contextlib.contextmanager
    def active(self):
        """The float64 patches and (unless disabled) the downcast guard, for one forward."""
        if self.guard:
            fail_unless(TorchFunctionMode is not None, "torch.overrides.TorchFunctionMode is "
                        "missing (torch < 1.13): run with --no-dtype-guard to skip the guard")
        n_rot, n_rms, n_down = self.rotary_calls, self.rms_calls, len(self.downcasts)
        with self._float64_softmax(), (self._mode() if self.guard else contextlib.nullcontext()):
            yield
        if self.rope:
            fail_unless(self.rotary_calls > n_rot, f"{self.name}: the forward never called the "
                        "rotary module that was checked")
        if self.spec["family"] == "llama":
            fail_unless(self.rms_calls - n_rms == 2 * self.arch["L"] + 1,
                        f"{self.name}: {self.rms_calls - n_rms} RMSNorm calls in one forward")
        fail_unless(len(self.downcasts) == n_down,
                    f"{self.name}: torch calls that rounded float64 values to a lower precision "
                    f"inside the model: {sorted(set(self.downcasts[n_down:]))}")

    def forward(self, model, tokens):
        with self.active():
            out = model(input_ids=tokens, use_cache=False)
        logits = out.logits if hasattr(out, "logits") else out[0]
        fail_unless(logits.dtype == torch.float64, f"{self.name}: logits in {logits.dtype}")
        fail_unless(tuple(logits.shape) == (*tokens.shape, VOCAB),
                    f"{self.name}: logits of shape {tuple(logits.shape)}")
        return logits


# ----------------------------------------------------------------------------- plain torch


def _linear(mod, x, n_in, n_out, W):
    """x through a transformers Linear ([out, in]) or Conv1D ([in, out]) module."""
    w = W(mod.weight)
    kind = type(mod).__name__
    if kind == "Conv1D":
        fail_unless(tuple(w.shape) == (n_in, n_out), f"Conv1D weight {tuple(w.shape)}, "
                    f"expected [{n_in}, {n_out}]")
        y = x @ w
    else:
        fail_unless(tuple(w.shape) == (n_out, n_in), f"{kind} weight {tuple(w.shape)}, "
                    f"expected [{n_out}, {n_in}]")
        y = x @ w.T
    b = getattr(mod, "bias", None)
    return y if b is None else y + W(b)


def plain_forward(spec, model, W, tokens):
    """The model written out in plain float64 torch, from the numbers in spec["arch"] (not from
    transformers' config), reading each weight as W(the model's parameter); a check of the
    transformers result. Navigates transformers' module tree for the weights only."""
    a, fam = spec["arch"], spec["family"]
    L, C, H, Hkv, D, Fd, eps = a["L"], a["C"], a["H"], a["Hkv"], a["D"], a["F"], a["eps"]
    bsz, t_len = tokens.shape
    heads = lambda t, n: t.reshape(bsz, t_len, n, D).transpose(1, 2)  # noqa: E731
    merge = lambda t: t.transpose(1, 2).reshape(bsz, t_len, -1)  # noqa: E731
    lin = lambda mod, x, i, o: _linear(mod, x, i, o, W)  # noqa: E731
    ln = lambda mod, x: layernorm(x, W(mod.weight), W(mod.bias), eps)  # noqa: E731
    head = W(model.get_output_embeddings().weight)
    if fam == "gpt2":
        tr = model.transformer
        x = W(tr.wte.weight)[tokens] + W(tr.wpe.weight)[:t_len]
        fail_unless(len(tr.h) == L, f"{len(tr.h)} blocks")
        for blk in tr.h:
            q, k, v = lin(blk.attn.c_attn, ln(blk.ln_1, x), C, 3 * C).split(C, dim=-1)
            y = merge(attention(heads(q, H), heads(k, H), heads(v, H)))
            x = x + lin(blk.attn.c_proj, y, C, C)
            h = gelu_tanh(lin(blk.mlp.c_fc, ln(blk.ln_2, x), C, Fd))
            x = x + lin(blk.mlp.c_proj, h, Fd, C)
        return ln(tr.ln_f, x) @ head.T
    if fam == "llama":
        m = model.model
        theta = spec["rope"]["theta"]
        x = W(m.embed_tokens.weight)[tokens]
        fail_unless(len(m.layers) == L, f"{len(m.layers)} layers")
        for lyr in m.layers:
            at, mlp = lyr.self_attn, lyr.mlp
            h = rmsnorm(x, W(lyr.input_layernorm.weight), eps)
            q = rope(heads(lin(at.q_proj, h, C, H * D), H), theta)
            k = rope(heads(lin(at.k_proj, h, C, Hkv * D), Hkv), theta)
            v = heads(lin(at.v_proj, h, C, Hkv * D), Hkv)
            x = x + lin(at.o_proj, merge(attention(q, k, v)), H * D, C)
            h = rmsnorm(x, W(lyr.post_attention_layernorm.weight), eps)
            g = F.silu(lin(mlp.gate_proj, h, C, Fd)) * lin(mlp.up_proj, h, C, Fd)
            x = x + lin(mlp.down_proj, g, Fd, C)
        return rmsnorm(x, W(m.norm.weight), eps) @ head.T
    if fam == "neox":
        g = model.gpt_neox
        R, theta = rotary_dims(a, spec["rope"]), spec["rope"]["theta"]
        part = lambda t: torch.cat([rope(t[..., :R], theta), t[..., R:]], dim=-1)  # noqa: E731
        x = W(g.embed_in.weight)[tokens]
        fail_unless(len(g.layers) == L, f"{len(g.layers)} layers")
        for lyr in g.layers:
            at, mlp = lyr.attention, lyr.mlp
            qkv = lin(at.query_key_value, ln(lyr.input_layernorm, x), C, 3 * C)
            q, k, v = qkv.reshape(bsz, t_len, H, 3, D).unbind(3)  # per head [q k v]
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            y = lin(at.dense, merge(attention(part(q), part(k), v)), C, C)
            h = gelu_erf(lin(mlp.dense_h_to_4h, ln(lyr.post_attention_layernorm, x), C, Fd))
            x = x + y + lin(mlp.dense_4h_to_h, h, Fd, C)  # parallel residual
        return ln(g.final_layer_norm, x) @ head.T
    raise Failure(f"unknown family {fam}")


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ----------------------------------------------------------------------------- transformers glue


def version_tuple(v):
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def dtype_kwarg(tf):
    """from_pretrained's dtype keyword: dtype from 4.56 on, torch_dtype before."""
    return "dtype" if version_tuple(tf.__version__) >= (4, 56) else "torch_dtype"


def known_config_keys(tf, cls):
    """The keys a config class names: its __init__ parameters and (dataclass-style configs)
    annotations, and those of the base config class."""
    keys = set()
    base = getattr(tf, "PreTrainedConfig", None) or getattr(tf, "PretrainedConfig", cls)
    for c in (cls, base):
        keys |= {k for k, p in inspect.signature(c.__init__).parameters.items()
                 if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        for k in inspect.getmro(c):
            keys |= set(getattr(k, "__annotations__", {}))
    return keys


def rope_spellings(spec):
    """Every spelling of the rope settings, newest first: transformers 5 keeps them in
    rope_parameters; 4.4x in rope_theta (+ partial_rotary_factor), GPT-NeoX before that in
    rotary_emb_base / rotary_pct."""
    theta, pct = float(spec["rope"]["theta"]), float(spec["rope"]["pct"])
    rp = dict(rope_type="default", rope_theta=theta)
    out = {"rope_parameters": rp, "rope_theta": theta}
    if spec["family"] == "neox":
        rp["partial_rotary_factor"] = pct
        out.update(partial_rotary_factor=pct, rotary_pct=pct, rotary_emb_base=theta)
    return out


def check_rope_config(name, config, spec):
    """The effective rope settings, however the version spells them: every spelling present
    agrees, at least one is present, and no scaling is configured."""
    theta, pct = float(spec["rope"]["theta"]), float(spec["rope"]["pct"])
    seen = {"theta": [], "pct": []}
    for key in ("rope_parameters", "rope_scaling"):
        rp = getattr(config, key, None)
        if rp is None:
            continue
        fail_unless(isinstance(rp, dict), f"{name}: config.{key} = {rp!r}")
        kind = rp.get("rope_type", rp.get("type", "default"))
        fail_unless(kind == "default", f"{name}: config.{key} = {rp}: not plain rope")
        if "rope_theta" in rp:
            seen["theta"].append((f"{key}['rope_theta']", rp["rope_theta"]))
        if "partial_rotary_factor" in rp:
            seen["pct"].append((f"{key}['partial_rotary_factor']", rp["partial_rotary_factor"]))
    for key, what in (("rope_theta", "theta"), ("rotary_emb_base", "theta"),
                      ("partial_rotary_factor", "pct"), ("rotary_pct", "pct")):
        got = getattr(config, key, None)
        if got is not None:
            seen[what].append((f"{key}", got))
    for what, want in (("theta", theta), ("pct", pct)):
        for key, got in seen[what]:
            fail_unless(math.isclose(float(got), want), f"{name}: config.{key} = {got}, "
                        f"expected {want}")
    fail_unless(seen["theta"], f"{name}: the config holds no rope base under any spelling")
    if spec["family"] == "neox":
        fail_unless(seen["pct"], f"{name}: the config holds no rotary fraction under any spelling")
    return {k: [f"{n}={v}" for n, v in vals] for k, vals in seen.items()}


def make_config(tf, name, spec):
    """The model's config, from spec["config"] plus the rope settings in the spellings that
    this version's config class names; every field checked after construction."""
    cls = getattr(tf, spec["config_cls"])
    known = known_config_keys(tf, cls)
    kwargs = dict(spec["config"])
    if spec["rope"]:
        spell = {k: v for k, v in rope_spellings(spec).items() if k in known}
        fail_unless(spell, f"{name}: {cls.__name__} names none of {sorted(rope_spellings(spec))}"
                    " (how does this version take the rope settings?)")
        kwargs.update(spell)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        print(f"{name}: note: {cls.__name__} does not name {unknown}; they are kept as plain "
              "attributes (the model checks below decide whether that matters)", file=sys.stderr)
    config = cls(**kwargs)
    check_config(name, config, spec)
    return config


def check_config(name, config, spec):
    for key, want in spec["config"].items():
        got = getattr(config, key, "<absent>")
        ok = (math.isclose(float(got), want) if isinstance(want, float) and
              isinstance(got, (int, float)) else got == want)
        fail_unless(ok, f"{name}: config.{key} = {got!r}, expected {want!r}")
    if spec["rope"]:
        check_rope_config(name, config, spec)


def set_eager(model):
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("eager")
        else:
            model.config._attn_implementation = "eager"
    got = getattr(model.config, "_attn_implementation", "eager")
    fail_unless(got == "eager", f"the model does not use eager attention: {got}")


def init_weights(model, seed):
    """Every parameter (a tied one once), in named_parameters order, from a generator seeded
    with `seed`: >= 2 dims N(0, 0.2^2), 1-dim *.weight (norms) 1 + 0.1 N(0, 1), 1-dim *.bias
    0.1 N(0, 1). Drawn in float64, rounded to the parameter's dtype."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            z = torch.randn(tuple(p.shape), generator=gen, dtype=torch.float64)
            if p.dim() >= 2:
                v = INIT["matrix_std"] * z
            elif n.endswith("weight"):
                v = 1.0 + 0.1 * z
            elif n.endswith("bias"):
                v = 0.1 * z
            else:
                raise Failure(f"parameter {n} {tuple(p.shape)}: neither a matrix, a norm weight "
                              "nor a bias")
            p.copy_(v.to(p.dtype))


def expected_numel(spec):
    """The parameter count the architecture implies (a tied head counted once)."""
    a, fam = spec["arch"], spec["family"]
    L, C, H, Hkv, D, Fd = a["L"], a["C"], a["H"], a["Hkv"], a["D"], a["F"]
    emb = VOCAB * C
    if fam == "gpt2":
        block = 4 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * Fd + Fd) + (Fd * C + C)
        return emb + spec["config"]["n_positions"] * C + L * block + 2 * C
    if fam == "llama":
        block = 2 * C + C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * Fd
        return emb * (1 if a["tied"] else 2) + L * block + C
    block = 4 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * Fd + Fd) + (Fd * C + C)
    return emb * (1 if a["tied"] else 2) + L * block + 2 * C


def check_tie(name, model, tied):
    inp, out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    fail_unless((inp is out) == tied, f"{name}: the head is {'' if inp is out else 'not '}tied "
                f"to the embedding, expected {'tied' if tied else 'untied'}")


def save_model(tf, name, spec, model, directory):
    """save_pretrained, safetensors only; returns the files written."""
    if os.path.exists(directory):
        fail_unless(os.path.isdir(directory) and (not os.listdir(directory) or os.path.exists(
            os.path.join(directory, "config.json"))), f"{directory} exists and is not a model "
            "directory this script wrote; remove it first")
        shutil.rmtree(directory)
    params = inspect.signature(model.save_pretrained).parameters
    kwargs = {}
    if "safe_serialization" in params:
        kwargs["safe_serialization"] = True
    if spec["shard"]:
        kwargs["max_shard_size"] = spec["shard"]
    model.save_pretrained(directory, **kwargs)
    files = sorted(os.listdir(directory))
    bad = [f for f in files if f.endswith((".bin", ".pt", ".pth", ".h5", ".msgpack"))]
    fail_unless(not bad, f"{name}: save_pretrained wrote non-safetensors weights {bad}")
    if not os.path.exists(os.path.join(directory, "generation_config.json")):
        print(f"{name}: note: save_pretrained wrote no generation_config.json; writing "
              "GenerationConfig.from_model_config(config)", file=sys.stderr)
        tf.GenerationConfig.from_model_config(model.config).save_pretrained(directory)
    with open(os.path.join(directory, "generation_config.json")) as f:
        gen = json.load(f)
    for key, want in (("bos_token_id", BOS), ("eos_token_id", EOS)):
        if key not in gen:
            print(f"{name}: note: generation_config.json has no {key}", file=sys.stderr)
        fail_unless(gen.get(key, want) == want, f"{name}: generation_config.json {key} = "
                    f"{gen.get(key)!r}, expected {want}")
    index = os.path.join(directory, "model.safetensors.index.json")
    shards = [f for f in os.listdir(directory) if f.endswith(".safetensors")]
    if spec["shard"]:
        fail_unless(os.path.exists(index) and len(shards) >= MIN_SHARDS,
                    f"{name}: max_shard_size={spec['shard']} gave {len(shards)} shard(s) "
                    f"{sorted(shards)}, expected >= {MIN_SHARDS} and an index")
    else:
        fail_unless(shards == ["model.safetensors"] and not os.path.exists(index),
                    f"{name}: expected one model.safetensors, got {sorted(os.listdir(directory))}")
    with open(os.path.join(directory, "config.json")) as f:
        saved_cfg = json.load(f)
    for key in ("bos_token_id", "eos_token_id", "tie_word_embeddings", "vocab_size"):
        if key in spec["config"]:
            fail_unless(saved_cfg.get(key) == spec["config"][key],
                        f"{name}: config.json {key} = {saved_cfg.get(key)!r}, expected "
                        f"{spec['config'][key]!r}")
    return sorted(os.listdir(directory))


def load_checked(tf, cls, directory, dtype, what):
    """cls.from_pretrained(directory) in dtype with eager attention; fails on any missing,
    unexpected or mismatched key, and on a loading log line about keys. Returns the model and
    the log lines it printed."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(f"{record.levelname}: {record.getMessage()}")

    logger = logging.getLogger("transformers")
    handler = Keep(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = cls.from_pretrained(directory, output_loading_info=True,
                                      attn_implementation="eager", **{dtype_kwarg(tf): dtype})
    finally:
        logger.removeHandler(handler)
    records += [f"warning: {w.category.__name__}: {w.message}" for w in caught]
    fail_unless(isinstance(got, tuple) and len(got) == 2,
                f"{what}: from_pretrained(output_loading_info=True) returned {type(got)}")
    model, info = got
    if not isinstance(info, dict):  # a dataclass or plain object in some versions
        info = dataclasses.asdict(info) if dataclasses.is_dataclass(info) else vars(info)
    problems = {k: v for k, v in info.items() if v}
    fail_unless(not problems, f"{what}: loading reported {problems}")
    keyish = [r for r in records if re.search(r"missing|unexpected|mismatch|newly initiali[sz]ed|"
                                              r"not initiali[sz]ed|were not used", r, re.I)]
    fail_unless(not keyish, f"{what}: loading warned about keys: {keyish}")
    set_eager(model)
    model.eval()
    for n, p in model.named_parameters():
        fail_unless(p.dtype == dtype, f"{what}: {n} loaded as {p.dtype}, asked for {dtype}")
    return model, records


def map_saved_names(name, model, saved):
    """{saved tensor name: the model's parameter}: by name where the name and value agree,
    else by value (unique random values), so that a version that renames on save still maps.
    Every unique parameter must be matched exactly once, value for value."""
    params = dict(model.named_parameters())
    mapping, taken = {}, set()
    for key, arr in saved.items():
        p = params.get(key)
        if p is not None and tuple(p.shape) == arr.shape and np.array_equal(
                p.detach().double().numpy(), arr):
            mapping[key] = p
            taken.add(key)
    for key, arr in saved.items():
        if key in mapping:
            continue
        hits = [n for n, p in params.items() if n not in taken and tuple(p.shape) == arr.shape
                and np.array_equal(p.detach().double().numpy(), arr)]
        fail_unless(len(hits) == 1, f"{name}: saved tensor {key} {list(arr.shape)} matches "
                    f"{hits or 'no'} loaded parameter(s)")
        print(f"{name}: note: saved {key} is the model's {hits[0]}", file=sys.stderr)
        mapping[key] = params[hits[0]]
        taken.add(hits[0])
    fail_unless(taken == set(params), f"{name}: loaded parameters {sorted(set(params) - taken)} "
                "are in no saved tensor")
    return mapping


# ----------------------------------------------------------------------------- one fixture


def build_and_save(tf, name, spec, directory):
    config = make_config(tf, name, spec)
    torch.manual_seed(spec["seed"])
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        model = getattr(tf, spec["model_cls"])(config)
    finally:
        torch.set_default_dtype(prev)
    check_config(name, model.config, spec)
    check_tie(name, model, spec["arch"]["tied"])
    numel = sum(p.numel() for p in model.parameters())
    fail_unless(numel == expected_numel(spec), f"{name}: {numel} parameters, the architecture "
                f"implies {expected_numel(spec)}")
    init_weights(model, spec["seed"])
    model.to(TORCH_DTYPES[spec["dtype"]])
    model.eval()
    return save_model(tf, name, spec, model, directory)


def make_fixture(tf, name, spec, out_dir, command, guard):
    directory = os.path.join(out_dir, name)
    files = build_and_save(tf, name, spec, directory)
    saved, dtypes, shard_files = saved_tensors(directory)
    want_dt = ST_NAMES[spec["dtype"]]
    fail_unless(set(dtypes.values()) == {want_dt}, f"{name}: saved dtypes "
                f"{sorted(set(dtypes.values()))}, expected {want_dt}")

    # The reference model: the saved directory, in float64.
    model, _ = load_checked(tf, getattr(tf, spec["model_cls"]), directory, torch.float64,
                            f"{name} (reload)")
    check_config(name, model.config, spec)
    check_tie(name, model, spec["arch"]["tied"])
    mapping = map_saved_names(name, model, saved)
    names = list(saved)  # file order of the saved tensors
    params = [mapping[n] for n in names]
    init = [p.detach().clone() for p in params]

    rng = np.random.RandomState(SEED)
    seq = rng.randint(0, VOCAB, size=(B, T + 1)).astype(np.int32)
    tokens_np, targets_np = np.ascontiguousarray(seq[:, :T]), np.ascontiguousarray(seq[:, 1:])
    tokens, targets = torch.from_numpy(tokens_np).long(), torch.from_numpy(targets_np).long()

    patches = Float64Patches(name, model, spec, guard=guard)
    model.zero_grad(set_to_none=True)
    logits = patches.forward(model, tokens)
    loss = cross_entropy(logits, targets)
    loss.backward()
    for n, p in zip(names, params):
        fail_unless(p.grad is not None and p.grad.dtype == torch.float64, f"{name}: {n} has no "
                    "float64 gradient")
    grads = [p.grad.detach().clone() for p in params]
    grad_norm = torch_train_step(params, OPTIM)
    with torch.no_grad():
        loss_after = cross_entropy(patches.forward(model, tokens), targets)
    after = [p.detach().clone() for p in params]

    # The independent check: plain torch, its own leaves, autograd, the written-out step.
    leaves = [t.clone().requires_grad_() for t in init]
    by_id = {id(p): leaf for p, leaf in zip(params, leaves)}
    pt_logits = plain_forward(spec, model, lambda p: by_id[id(p)], tokens)
    pt_loss = cross_entropy(pt_logits, targets)
    pt_grads = torch.autograd.grad(pt_loss, leaves)
    pt_norm, clipped = clip_grads_replica(pt_grads, OPTIM["grad_clip"], OPTIM["clip_eps"])
    pt_after = adamw_first_step_replica(init, clipped, OPTIM)
    after_by_id = {id(p): a for p, a in zip(params, pt_after)}
    with torch.no_grad():
        pt_loss_after = cross_entropy(plain_forward(spec, model, lambda p: after_by_id[id(p)],
                                                    tokens), targets)
    dev = {"logits": rel_err(pt_logits.detach(), logits.detach()),
           "loss": abs(pt_loss.item() - loss.item()) / loss.item(),
           "grad_norm": abs(pt_norm - grad_norm) / grad_norm,
           "loss_after": abs(pt_loss_after.item() - loss_after.item()) / loss_after.item()}
    dev["grad"], dev["grad_worst"] = max((rel_err(pg, g), n)
                                         for n, pg, g in zip(names, pt_grads, grads))
    dev["update"], dev["update_worst"] = max((rel_err(pa - p0, a - p0), n)
                                             for n, pa, a, p0 in zip(names, pt_after, after, init))
    largest = max(v for v in dev.values() if isinstance(v, float))
    report = ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"({v})" for k, v in dev.items())
    fail_unless(largest < 1e-6, f"{name}: transformers and the plain-torch model disagree "
                f"(relative): {report}")
    if largest > 1e-10:
        print(f"{name}: warning: transformers and plain torch agree only to {largest:.1e} "
              f"(float64 gives ~1e-14; a float32 step left?): {report}", file=sys.stderr)

    f32 = lambda t: t.detach().numpy().astype(np.float32)  # noqa: E731
    tensors = [("tokens", tokens_np), ("targets", targets_np), ("logits", f32(logits)),
               ("loss", np.array([loss.item()], np.float32)),
               ("loss_after", np.array([loss_after.item()], np.float32)),
               ("grad_norm", np.array([grad_norm], np.float32))]
    tensors += [("after." + n, f32(a)) for n, a in zip(names, after)]
    with open(os.path.join(directory, "config.json")) as f:
        config_json = f.read()
    metadata = {
        "model": name,
        "class": spec["model_cls"],
        "dtype": spec["dtype"],
        "config": json.dumps(json.loads(config_json), sort_keys=True),
        "files": json.dumps(files),
        "tokens": f"numpy.random.RandomState({SEED}).randint(0, {VOCAB}, size=({B}, {T + 1})); "
                  "tokens = [:, :16], targets = [:, 1:]",
        "loss_def": "mean cross-entropy over the 32 targets",
        "init": json.dumps(dict(INIT, seed=spec["seed"]), sort_keys=True),
        "optim": json.dumps(OPTIM, sort_keys=True),
        "precision": "float64 reference of the stored (rounded) weights, stored as float32",
        "reference": f"transformers {tf.__version__} {spec['model_cls']} from_pretrained in "
                     "float64, eager attention; rotary cos/sin, RMSNorm and softmax recomputed "
                     "in float64",
        "loss_f64": repr(loss.item()),
        "loss_after_f64": repr(loss_after.item()),
        "grad_norm_f64": repr(grad_norm),
        "rotary_fp32_dev": repr(patches.rotary_dev),
        "rmsnorm_fp32_dev": repr(patches.rms_dev),
        "softmax_fp32_redone_f64": str(patches.softmax_upcasts),
        "fp32_constants": json.dumps(sorted(patches.fresh)),
        "dtype_guard": "on" if guard else "off",
        "check_plain_torch": json.dumps(dev, sort_keys=True),
        "transformers": tf.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "command": command,
    }
    ref_path = os.path.join(out_dir, name + ".reference.safetensors")
    write_safetensors(ref_path, tensors, metadata)
    sizes = {f: os.path.getsize(os.path.join(directory, f)) for f in files}
    ref_size = os.path.getsize(ref_path)
    print(f"{name}: {spec['model_cls']} {spec['dtype']}, {len(names)} tensors in "
          f"{len(shard_files)} file(s); loss {loss.item():.6f} -> {loss_after.item():.6f}, "
          f"grad norm {grad_norm:.4f}; plain torch {largest:.1e}; fp32 rotary "
          f"{patches.rotary_dev:.1e}, RMSNorm {patches.rms_dev:.1e}, "
          f"{patches.softmax_upcasts} softmaxes redone")
    for f in files:
        print(f"  {directory}/{f} ({sizes[f] / 1e3:.1f} kB)")
    print(f"  {ref_path} ({ref_size / 1e3:.1f} kB)")
    return sum(sizes.values()) + ref_size


# ----------------------------------------------------------------------------- --check-load


def check_load_tolerance(ref_meta, dir_dtype):
    """Relative tolerance on max |logit difference| / max |reference logit|.

    The directory is run in float32: forward rounding of a 2-layer model with dot products of
    length <= 256 stays far below 512 u32 (3e-5) of the logit scale. If its weights are stored
    coarser than the reference's (e.g. bf16 exports of a float32 reference), each weight moves
    by up to u_w relative and the logits by a few u_w: 16 u_w more."""
    tol = 512 * U32
    ref_dt = ST_NAMES.get(ref_meta.get("dtype", "float32"), "F32")
    if UNIT_ROUNDOFF.get(dir_dtype, U32) > UNIT_ROUNDOFF.get(ref_dt, U32):
        tol += 16 * UNIT_ROUNDOFF[dir_dtype]
    return tol


def check_load(tf, dirs, reference, tolerance):
    ref, _, ref_meta = read_safetensors_any(reference)
    for key in ("tokens", "logits"):
        fail_unless(key in ref, f"{reference} has no {key}")
    tokens = torch.from_numpy(ref["tokens"]).long()
    want = torch.from_numpy(ref["logits"])
    failed = 0
    for d in dirs:
        try:
            _, dtypes, _ = saved_tensors(d)
            kinds = sorted(set(dtypes.values()))
            dir_dt = kinds[0] if len(kinds) == 1 else "F32"
            tol = tolerance if tolerance is not None else check_load_tolerance(ref_meta, dir_dt)
            model, records = load_checked(tf, tf.AutoModelForCausalLM, d, torch.float32, d)
            with torch.no_grad():
                out = model(input_ids=tokens, use_cache=False)
            logits = (out.logits if hasattr(out, "logits") else out[0]).double()
            fail_unless(tuple(logits.shape) == tuple(want.shape),
                        f"logits {tuple(logits.shape)}, reference {tuple(want.shape)}")
            diff = (logits - want).abs()
            max_abs = diff.max().item()
            rel = max_abs / want.abs().max().item()
            normwise = rel_err(logits, want)
            ok = rel <= tol
            failed += not ok
            print(f"{'OK  ' if ok else 'FAIL'} {d}: {type(model).__name__} stored {'/'.join(kinds)}"
                  f", run in float32: max |dlogit| {max_abs:.3e}, / max |logit| {rel:.3e} "
                  f"(tolerance {tol:.1e}), normwise {normwise:.3e}"
                  + (f"; {len(records)} log line(s): {records}" if records else ""))
        except Failure as e:
            failed += 1
            print(f"FAIL {d}: {e}")
    return failed


# ----------------------------------------------------------------------------- --self-check


def _stand_in(spec):
    """(a module tree shaped like spec's transformers model, the same weights under
    make_fixtures' names and layout, make_fixtures' config) for the plain_forward check."""
    a, fam = spec["arch"], spec["family"]
    L, C, H, Hkv, D, Fd = a["L"], a["C"], a["H"], a["Hkv"], a["D"], a["F"]
    gen = torch.Generator().manual_seed(7)
    rnd = lambda *shape: torch.nn.Parameter(  # noqa: E731
        0.2 * torch.randn(*shape, generator=gen, dtype=torch.float64))
    one = lambda n: torch.nn.Parameter(  # noqa: E731
        1 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64))

    def node(cls_name="Module", **children):
        m = type(cls_name, (torch.nn.Module,), {})()
        for k, v in children.items():
            setattr(m, k, v)
        return m

    def linear(i, o, bias, conv=False):  # Conv1D holds [in, out], Linear [out, in]
        w = rnd(i, o) if conv else rnd(o, i)
        return node("Conv1D" if conv else "Linear", weight=w, bias=rnd(o) if bias else None)

    def norm(n, bias=True):
        return node("LayerNorm", weight=one(n), bias=rnd(n) if bias else None)

    cfg = dict(family=fam, vocab=VOCAB, vocab_padded=VOCAB, d_model=C, n_layer=L, n_head=H,
               n_kv_head=Hkv, d_ff=Fd, norm_eps=a["eps"])
    if spec["rope"]:
        cfg.update(rope_theta=spec["rope"]["theta"], rotary_pct=spec["rope"]["pct"])
    p = {}
    emb = node("Embedding", weight=rnd(VOCAB, C))
    p["embedding.wte"] = emb.weight
    if fam == "gpt2":
        wpe = node("Embedding", weight=rnd(spec["config"]["n_positions"], C))
        p["embedding.wpe"] = wpe.weight
        blocks = []
        for l in range(L):
            b = node(ln_1=norm(C), ln_2=norm(C),
                     attn=node(c_attn=linear(C, 3 * C, True, True), c_proj=linear(C, C, True, True)),
                     mlp=node(c_fc=linear(C, Fd, True, True), c_proj=linear(Fd, C, True, True)))
            for ours, mod in (("ln1", b.ln_1), ("ln2", b.ln_2), ("qkv", b.attn.c_attn),
                              ("proj", b.attn.c_proj), ("fc", b.mlp.c_fc), ("fc2", b.mlp.c_proj)):
                w = mod.weight if ours.startswith("ln") else mod.weight.T
                p[f"block.{l}.{ours}_w"], p[f"block.{l}.{ours}_b"] = w, mod.bias
            blocks.append(b)
        lnf = norm(C)
        p["head.lnf_w"], p["head.lnf_b"] = lnf.weight, lnf.bias
        body = node(wte=emb, wpe=wpe, h=torch.nn.ModuleList(blocks), ln_f=lnf)
        model = node(transformer=body)
        head = emb
    elif fam == "llama":
        layers = []
        for l in range(L):
            at = node(q_proj=linear(C, H * D, False), k_proj=linear(C, Hkv * D, False),
                      v_proj=linear(C, Hkv * D, False), o_proj=linear(H * D, C, False))
            mlp = node(gate_proj=linear(C, Fd, False), up_proj=linear(C, Fd, False),
                       down_proj=linear(Fd, C, False))
            lyr = node(self_attn=at, mlp=mlp, input_layernorm=norm(C, False),
                       post_attention_layernorm=norm(C, False))
            p[f"block.{l}.norm1_w"] = lyr.input_layernorm.weight
            p[f"block.{l}.qkv_w"] = torch.cat([at.q_proj.weight, at.k_proj.weight,
                                               at.v_proj.weight])
            p[f"block.{l}.proj_w"] = at.o_proj.weight
            p[f"block.{l}.norm2_w"] = lyr.post_attention_layernorm.weight
            p[f"block.{l}.w13"] = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            p[f"block.{l}.w2"] = mlp.down_proj.weight
            layers.append(lyr)
        fin = norm(C, False)
        head = emb if a["tied"] else node("Linear", weight=rnd(VOCAB, C))
        p["head.norm_w"], p["head.head_w"] = fin.weight, head.weight
        model = node(model=node(embed_tokens=emb, layers=torch.nn.ModuleList(layers), norm=fin))
    else:
        from make_fixtures import qkv_hf_to_tandem
        layers = []
        for l in range(L):
            at = node(query_key_value=linear(C, 3 * C, True), dense=linear(C, C, True))
            mlp = node(dense_h_to_4h=linear(C, Fd, True), dense_4h_to_h=linear(Fd, C, True))
            lyr = node(attention=at, mlp=mlp, input_layernorm=norm(C),
                       post_attention_layernorm=norm(C))
            for ours, mod in (("ln1", lyr.input_layernorm), ("qkv", at.query_key_value),
                              ("proj", at.dense), ("ln2", lyr.post_attention_layernorm),
                              ("fc", mlp.dense_h_to_4h), ("fc2", mlp.dense_4h_to_h)):
                w, b = mod.weight, mod.bias
                if ours == "qkv":
                    w, b = qkv_hf_to_tandem(w, H, D), qkv_hf_to_tandem(b, H, D)
                p[f"block.{l}.{ours}_w"], p[f"block.{l}.{ours}_b"] = w, b
            layers.append(lyr)
        fin = norm(C)
        head = node("Linear", weight=rnd(VOCAB, C))
        p["head.lnf_w"], p["head.lnf_b"], p["head.head_w"] = fin.weight, fin.bias, head.weight
        model = node(gpt_neox=node(embed_in=emb, layers=torch.nn.ModuleList(layers),
                                   final_layer_norm=fin))
    model.get_output_embeddings = lambda: head
    return model, p, cfg


def self_check():
    """The script's pieces that need no transformers; prints one line per check."""
    results = []

    def check(what, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        # The writer and reader round-trip F32 / I32 and the metadata.
        path = os.path.join(tmp, "a.safetensors")
        a = np.random.RandomState(0).randn(3, 5).astype(np.float32)
        i = np.arange(-4, 8, dtype=np.int32).reshape(2, 6)
        write_safetensors(path, [("a", a), ("i", i), ("s", np.array([1.5], np.float32))],
                          {"k": "v", "n": 3})
        t, d, m = read_safetensors_any(path)
        check("safetensors F32/I32 round trip", np.array_equal(t["a"], a.astype(np.float64)) and
              np.array_equal(t["i"], i) and d == {"a": "F32", "i": "I32", "s": "F32"} and
              m == {"k": "v", "n": "3"} and os.path.getsize(path) % 8 == 0)
        # BF16 and F16 decode exactly (bit patterns from torch).
        x = torch.randn(4, 7) * 3
        raw_bf = x.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
        raw_f16 = x.to(torch.float16).numpy().astype("<f2").tobytes()
        header = {"b": {"dtype": "BF16", "shape": [4, 7], "data_offsets": [0, len(raw_bf)]},
                  "h": {"dtype": "F16", "shape": [4, 7],
                        "data_offsets": [len(raw_bf), len(raw_bf) + len(raw_f16)]}}
        text = json.dumps(header).encode()
        path = os.path.join(tmp, "b.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + raw_bf + raw_f16)
        t, d, _ = read_safetensors_any(path)
        check("safetensors BF16/F16 decode",
              np.array_equal(t["b"], x.to(torch.bfloat16).double().numpy()) and
              np.array_equal(t["h"], x.to(torch.float16).double().numpy()))
        with open(path, "ab") as f:
            f.write(b"\0" * 4)
        try:
            read_safetensors_any(path)
            check("safetensors trailing bytes rejected", False)
        except Failure:
            check("safetensors trailing bytes rejected", True)

    # The AdamW replica equals torch's, with the clip active and not; zero-gradient rows too.
    for scale, what in ((10.0, "clipping"), (1e-3, "no clipping")):
        shapes = [(6, 4), (4,), (5, 3), (3,)]
        p0 = [torch.randn(s, dtype=torch.float64) for s in shapes]
        g0 = [torch.randn(s, dtype=torch.float64) * scale for s in shapes]
        g0[0][2] = 0.0  # a row no token used: decay only
        ps = [p.clone().requires_grad_() for p in p0]
        for p, g in zip(ps, g0):
            p.grad = g.clone()
        norm = torch_train_step(ps, OPTIM)
        r_norm, clipped = clip_grads_replica(g0, OPTIM["grad_clip"], OPTIM["clip_eps"])
        rep = adamw_first_step_replica(p0, clipped, OPTIM)
        dev = max((p.detach() - r).abs().max().item() for p, r in zip(ps, rep))
        moved = min((p.detach() - q).abs().max().item() for p, q in zip(ps, p0))
        check(f"AdamW + clip replica = torch ({what})", dev < 1e-15 and moved > 1e-5 and
              abs(norm - r_norm) < 1e-12 * r_norm, f"max |diff| {dev:.1e}, grad norm "
              f"{norm:.4g} vs {r_norm:.4g}")
        row = ps[0].detach()[2]
        check(f"zero-gradient row only decays ({what})",
              torch.allclose(row, p0[0][2] * (1 - OPTIM["lr"] * OPTIM["weight_decay"]),
                             rtol=0, atol=1e-16))

    # The float64 patches on stand-ins shaped like transformers' modules.
    class FakeRMSNorm(torch.nn.Module):
        def __init__(self, n, eps):
            super().__init__()
            self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(n, dtype=torch.float64))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            dt = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            var = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(var + self.variance_epsilon)
            return self.weight * hidden_states.to(dt)

    class FakeRotaryEmbedding(torch.nn.Module):
        def __init__(self, dim, base):
            super().__init__()
            self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))

        def forward(self, x, position_ids):
            f = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
            ang = (f @ position_ids[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((ang, ang), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    class Fake(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.norms = torch.nn.ModuleList([FakeRMSNorm(16, 1e-5) for _ in range(5)])
            self.rot = FakeRotaryEmbedding(16, base)

        def forward(self, x, pos):
            cos, sin = self.rot(x, pos)
            for n in self.norms:
                x = n(x)
            s = torch.nn.functional.softmax(x @ x.transpose(-1, -2), dim=-1, dtype=torch.float32)
            return x * cos + x * sin, s

    spec = dict(family="llama", rope=dict(theta=10000.0, pct=1.0),
                arch=dict(L=2, D=16, eps=1e-5))
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    pos = torch.arange(12)[None].expand(2, 12)
    fake = Fake(10000.0)
    plain = fake(x, pos)[0]
    patches = Float64Patches("fake", fake, spec, guard=TorchFunctionMode is not None)
    with patches.active():
        y, s = fake(x, pos)
    want = x
    for n in fake.norms:
        want = n.weight * (want * torch.rsqrt((want * want).mean(-1, keepdim=True) + 1e-5))
    ang = torch.arange(12, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    emb = torch.cat([ang, ang], -1)
    want = want * torch.cos(emb) + want * torch.sin(emb)
    check("float64 patches: RMSNorm, rotary, softmax in float64",
          (y - want).abs().max().item() < 1e-13 and s.dtype == torch.float64 and
          patches.softmax_upcasts == 1 and (plain - want).abs().max().item() > 1e-9,
          f"patched {(y - want).abs().max().item():.1e}, unpatched "
          f"{(plain - want).abs().max().item():.1e}, rotary fp32 {patches.rotary_dev:.1e}, "
          f"RMSNorm fp32 {patches.rms_dev:.1e}")

    bad = Fake(500000.0)  # transformers' base differs from the expected one
    patches = Float64Patches("fake", bad, spec, guard=False)
    try:
        with patches.active():
            bad(x, pos)
        check("a wrong rope base is caught", False)
    except Failure as e:
        check("a wrong rope base is caught", "rotary" in str(e))

    if TorchFunctionMode is not None:
        class Leaky(Fake):
            def forward(self, x, pos):
                return super().forward(x.float().double(), pos)

        leaky = Leaky(10000.0)
        patches = Float64Patches("fake", leaky, spec, guard=True)
        try:
            with patches.active():
                leaky(x, pos)
            check("a float64 -> float32 downcast is caught", False)
        except Failure as e:
            check("a float64 -> float32 downcast is caught", "lower precision" in str(e), str(e))
    else:
        check("TorchFunctionMode available for the dtype guard", False, f"torch {torch.__version__}")

    # plain_forward, on stand-in module trees with transformers' attribute names and weight
    # layouts, equals make_fixtures' own models given the same weights in tandem's layout.
    tokens = torch.from_numpy(np.random.RandomState(SEED).randint(0, VOCAB, (B, T))).long()
    for name in ("gpt2", "llama", "neox"):
        model, ours, cfg = _stand_in(MODELS[name])
        got = plain_forward(MODELS[name], model, lambda p: p, tokens)
        want = mf_forward(cfg, ours, tokens)
        dev = rel_err(got.detach(), want.detach())
        check(f"plain_forward({name}) = make_fixtures' {cfg['family']} model", dev < 1e-12,
              f"{dev:.1e}")

    n_fail = results.count(False)
    print(f"self-check: {results.count(True)} passed, {n_fail} failed")
    return n_fail


# ----------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--out", default="tests/fixtures/hf", help="output directory (default "
                    "%(default)s)")
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS),
                    help="models to write (default: all)")
    ap.add_argument("--no-dtype-guard", action="store_true", help="do not watch the float64 "
                    "forward for calls that round to a lower precision (a diagnostic escape; "
                    "recorded in the metadata)")
    ap.add_argument("--check-load", nargs="+", metavar="DIR", help="load each Hugging Face "
                    "directory and compare its logits on --reference's tokens")
    ap.add_argument("--reference", help="a <name>.reference.safetensors, for --check-load")
    ap.add_argument("--tolerance", type=float, help="--check-load's relative tolerance "
                    "(default: derived from the dtypes, see check_load_tolerance)")
    ap.add_argument("--self-check", action="store_true", help="test this script's own pieces")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a fixed reduction order: reruns give identical files

    if args.self_check:
        sys.exit(1 if self_check() else 0)

    tf, why = import_transformers()
    if tf is None:
        sys.exit(f"make_hf_fixtures: Hugging Face transformers does not import ({why}); this "
                 "mode needs it")
    if version_tuple(tf.__version__) < (4, 40):
        print(f"make_hf_fixtures: warning: transformers {tf.__version__} is older than the "
              "4.4x/5.x this script was written for", file=sys.stderr)

    if args.check_load:
        if not args.reference:
            ap.error("--check-load needs --reference FILE")
        try:
            failed = check_load(tf, args.check_load, args.reference, args.tolerance)
        except Failure as e:
            sys.exit(f"make_hf_fixtures: {e}")
        sys.exit(1 if failed else 0)

    os.makedirs(args.out, exist_ok=True)
    command = " ".join(["python3", "tools/make_hf_fixtures.py"] + sys.argv[1:])
    total = 0
    for name in args.models:
        try:
            total += make_fixture(tf, name, MODELS[name], args.out, command,
                                  guard=not args.no_dtype_guard)
        except Failure as e:
            sys.exit(f"make_hf_fixtures: transformers {tf.__version__}, torch "
                     f"{torch.__version__}: {e}")
    print(f"total {total / 1e6:.2f} MB under {args.out}")


if __name__ == "__main__":
    main()
