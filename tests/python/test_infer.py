"""Inference from Python against the tandem command and the Hugging Face files."""
import json
import struct

import numpy as np
import pytest

import tandem
from conftest import FIXTURES, run_cli

HF = FIXTURES / "hf"


def read_safetensors(path):
    """name -> float64 array, read with nothing but the format's definition."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        chunk = body[a:b]
        if t["dtype"] == "F32":
            v = np.frombuffer(chunk, dtype="<f4").astype(np.float64)
        elif t["dtype"] == "F16":
            v = np.frombuffer(chunk, dtype="<f2").astype(np.float64)
        elif t["dtype"] == "BF16":
            v = (np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16).view("<f4")
            v = v.astype(np.float64)
        else:
            continue
        out[name] = v.reshape(t["shape"])
    return out


def cli_ids(model_dir, prompt_ids, tokens, *extra):
    r = run_cli("generate", "--checkpoint", model_dir, "--prompt-ids",
                ",".join(map(str, prompt_ids)), "--tokens", tokens, "--json", *extra)
    return json.loads(r.stdout)["ids"]


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_generate_equals_the_commands_tokens(family):
    model = tandem.load(HF / family)
    prompt = [5, 17, 42, 9]
    greedy = model.generate(prompt, max_new_tokens=24, temperature=0, ignore_eos=True)
    assert greedy.ids == cli_ids(HF / family, prompt, 24, "--temperature", "0", "--ignore-eos")
    assert greedy.finish == "length" and len(greedy.ids) == 24
    sampled = model.generate(prompt, max_new_tokens=16, temperature=0.8, top_k=20, top_p=0.9,
                             seed=11, ignore_eos=True)
    assert sampled.ids == cli_ids(HF / family, prompt, 16, "--temperature", "0.8", "--top-k",
                                  "20", "--top-p", "0.9", "--seed", "11", "--ignore-eos")


def test_streaming_yields_the_same_tokens_and_a_batch_gives_one_list_each():
    model = tandem.load(HF / "gpt2", batch=2)
    whole = model.generate([1, 2, 3], max_new_tokens=12, temperature=0, ignore_eos=True)
    it = model.generate([1, 2, 3], max_new_tokens=12, temperature=0, ignore_eos=True,
                        stream=True)
    assert list(it) == whole.ids
    assert it.result is not None and it.result.ids == whole.ids
    batch = model.generate([[1, 2, 3], [7, 8]], max_new_tokens=12, temperature=0,
                           ignore_eos=True)
    assert batch.ids[0] == whole.ids and len(batch.ids) == 2
    alone = model.generate([7, 8], max_new_tokens=12, temperature=0, ignore_eos=True)
    assert batch.ids[1] == alone.ids


def test_logits_are_the_next_token_scores_of_every_position():
    model = tandem.load(HF / "llama")
    ids = [3, 14, 15, 92, 65]
    logits = model.logits(ids)
    assert logits.shape == (len(ids), model.info["vocab"]) and logits.dtype == np.float32
    # Greedy decoding from each prefix draws the argmax of that position's row.
    for n in range(1, len(ids) + 1):
        nxt = model.generate(ids[:n], max_new_tokens=1, temperature=0, ignore_eos=True).ids
        assert nxt == [int(np.argmax(logits[n - 1]))]


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_parameters_are_the_hugging_face_tensors(family):
    model = tandem.load(HF / family)
    params = model.parameters()
    ref = read_safetensors(HF / family / "model.safetensors")
    for name, want in ref.items():
        if name not in params:  # a tied head's copy, buffers
            continue
        got = params[name]
        if got.shape != want.shape:  # GPT-NeoX's fused qkv, viewed [heads, 3, head_dim, ...]
            got = got.reshape(want.shape)
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float32))
    assert len(params) >= len([k for k in ref if "rotary" not in k and "masked_bias" not in k
                               and ".attn.bias" not in k]) - 1


def test_parameter_views_share_the_models_memory():
    model = tandem.load(HF / "gpt2")
    a, b = model.parameters(), model.parameters()
    name = "transformer.ln_f.weight" if "transformer.ln_f.weight" in a else "ln_f.weight"
    assert np.shares_memory(a[name], b[name])
    assert a[name].flags.writeable
    before = model.logits([1, 2, 3])
    assert np.abs(before).max() > 0
    # A final LayerNorm of zeros makes every hidden state, and so every logit, zero.
    a[name][:] = 0
    a[name.replace("weight", "bias")][:] = 0
    assert np.all(model.parameters()[name] == 0)
    np.testing.assert_array_equal(model.logits([1, 2, 3]), np.zeros_like(before))


def test_text_prompts_use_the_models_tokenizer(tmp_path, corpus):
    # A byte-level checkpoint speaks text through the byte tokenizer.
    ck = tmp_path / "ck"
    tandem.Trainer(dict(model="gpt2-tiny", data=str(corpus), batch=2, seq=32, steps=2,
                        save=str(ck))).train()
    model = tandem.load(ck)
    assert model.tokenizer is not None and model.tokenizer.kind == "byte"
    g = model.generate("the quick", max_new_tokens=8, temperature=0, ignore_eos=True)
    r = run_cli("generate", "--checkpoint", ck, "--prompt", "the quick", "--tokens", "8",
                "--temperature", "0", "--ignore-eos", "--json")
    out = json.loads(r.stdout)
    assert g.ids == out["ids"] and g.text == out["text"]


def test_bad_requests_raise_clear_errors():
    model = tandem.load(HF / "gpt2", max_seq=16)
    with pytest.raises(tandem.Error, match="top_p must be in"):
        model.generate([1], top_p=1.5)
    with pytest.raises(tandem.Error, match="leaving no room"):
        model.generate(list(range(16)))
    with pytest.raises(tandem.Error, match="batch 1"):
        model.generate([[1], [2]])
    with pytest.raises(tandem.Error, match="holds no tokenizer"):
        model.generate("text")
    with pytest.raises(tandem.Error, match="max_new_tokens"):
        model.generate([1], max_new_tokens=0)
    with pytest.raises(tandem.Error, match="over model"):
        tandem.load(HF / "gpt2", max_seq=10**6)
    with pytest.raises(tandem.Error, match="device must be cpu or cuda"):
        tandem.load(HF / "gpt2", device="tpu")
    # A capped request says so in its result: it ends at max_seq.
    g = model.generate(list(range(10)), max_new_tokens=50, temperature=0, ignore_eos=True)
    assert len(g.ids) == 6 and g.finish == "length"


def test_tokenizer_equals_the_command():
    tok_dir = FIXTURES / "tokenizers" / "gpt2"
    tok = tandem.Tokenizer.from_file(tok_dir)
    text = "Hello world, tandem's tokenizer!"
    r = run_cli("tokenize", "--tokenizer", tok_dir, "--text", text, "--json")
    ids = json.loads(r.stdout)["ids"]
    assert tok.encode(text) == ids
    assert tok.decode(ids) == text
    with pytest.raises(tandem.Error):
        tandem.Tokenizer.from_file(FIXTURES / "nope")


def test_plan_equals_the_command():
    p = tandem.plan(model="gpt2-tiny", ranks=2, batch=4, seq=64)
    r = run_cli("plan", "--model", "gpt2-tiny", "--ranks", 2, "--batch", 4, "--seq", 64, "--json")
    j = json.loads(r.stdout)
    names = [s["strategy"] for s in p["strategies"]]
    assert p["recommended"] in names
    cli = {s["name"]: s for s in j["strategies"]}
    for s in p["strategies"]:
        assert s["step_ms"] == pytest.approx(cli[s["strategy"]]["step_ms"], rel=1e-9)
    with pytest.raises(tandem.Error, match="strategy must be"):
        tandem.plan(strategy="zero9")
    assert "TFLOP/s bf16" in tandem.plan(dtype="bf16")["hardware"]
    assert "TFLOP/s fp32" in tandem.plan()["hardware"]
    with pytest.raises(tandem.Error, match="--dtype must be"):
        tandem.plan(dtype="fp8")
