"""The Python API on a GPU: run where one is (TANDEM_TEST_CUDA=1), skipped elsewhere."""
import json
import os

import numpy as np
import pytest

import tandem
from conftest import FIXTURES, run_cli

HF = FIXTURES / "hf"
pytestmark = pytest.mark.skipif(os.environ.get("TANDEM_TEST_CUDA") != "1",
                                reason="needs a GPU (set TANDEM_TEST_CUDA=1)")


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_cuda_generate_equals_the_commands_tokens(family):
    model = tandem.load(HF / family, device="cuda")
    g = model.generate([5, 17, 42, 9], max_new_tokens=16, temperature=0, ignore_eos=True)
    r = run_cli("generate", "--checkpoint", HF / family, "--device", "cuda", "--prompt-ids",
                "5,17,42,9", "--tokens", 16, "--temperature", 0, "--ignore-eos", "--json")
    assert g.ids == json.loads(r.stdout)["ids"]


def test_cuda_parameters_are_read_only_bf16_copies_and_logits_match_the_cpu():
    gpu, cpu = tandem.load(HF / "llama", device="cuda"), tandem.load(HF / "llama")
    pg, pc = gpu.parameters(), cpu.parameters()
    assert list(pg) == list(pc)
    for name, want in pc.items():
        got = pg[name]
        assert not got.flags.writeable and got.shape == want.shape
        # bf16 stores 7 fraction bits: rounding to nearest is within 2^-8 relative.
        np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=0)
    ids = [3, 14, 15, 92]
    lg, lc = gpu.logits(ids), cpu.logits(ids)
    assert lg.shape == lc.shape == (len(ids), gpu.info["vocab"])
    # bf16 activations through the model's few layers: a few bf16 steps of the logits' scale.
    assert np.abs(lg - lc).max() <= 8 * 2.0**-8 * np.abs(lc).max() + 1e-3
