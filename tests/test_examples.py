"""The worked examples of docs/ARCHITECTURE.md (tests/examples/, registered for the tests only by tests/conftest.py)
against their references, as a contributor's test file checks a new method: NTK at a fixed alpha against the
formula, the mirrored table row by row, the learned slope's bias against -slope * |i - j|. Every other check of
them comes from the registry (the contract suite, test_rope, test_rope_families, test_serving, ...); docs/ARCHITECTURE.md
shows each file as it is (tests/test_docs.py)."""

import math

import pytest
import torch
from test_attention_methods import SdpaCalls
from test_learned import tiny
from tiny import tiny_model, token_ids

import hf_posenc as hp
from hf_posenc.config import METHODS

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_examples_are_registered_here_and_not_in_the_package():
    import examples

    assert set(examples.EXAMPLES) == {"ntk_alpha", "reflect", "linear_bias"}
    assert all(METHODS[name] is cls for name, cls in examples.EXAMPLES.items())
    assert not any(cls.__module__.startswith("hf_posenc.") for cls in examples.EXAMPLES.values())


@pytest.mark.parametrize("alpha", [2.0, 4.0])
def test_ntk_alpha_theta_is_the_papers(alpha):
    model = tiny_model()
    theta, dim = model.config.rope_parameters["rope_theta"], 16
    old = model.model.rotary_emb.inv_freq.clone()
    hp.patch(model, "ntk_alpha", alpha=alpha)  # alpha alone: the advertised context stays the original one
    assert hp.describe(model)["max_position_embeddings"] == 64
    new_theta = theta * alpha ** (dim / (dim - 2))
    assert model.config.rope_parameters == {"rope_type": "default", "rope_theta": pytest.approx(new_theta, rel=1e-12)}
    inv_freq = model.model.rotary_emb.inv_freq.double()
    expected = torch.tensor([new_theta ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0)
    assert math.isclose(old[-1] / inv_freq[-1], alpha, rel_tol=1e-5)  # the lowest frequency: exactly 1 / alpha
    hp.unpatch(model)
    hp.patch(model, "ntk_alpha", alpha=alpha, max_position_embeddings=256)  # a target sets only the context
    assert model.config.rope_parameters["rope_theta"] == pytest.approx(new_theta, rel=1e-12)
    assert hp.describe(model)["max_position_embeddings"] == 256


def test_reflect_mirrors_the_rows():
    model = tiny("gpt2")
    old = model.transformer.wpe.weight.detach().clone()
    n = old.shape[0]
    hp.patch(model, "reflect", max_position_embeddings=3 * n + 5)
    there_and_back = list(range(n)) + list(range(n - 1, -1, -1))  # 0 .. n-1, then n-1 .. 0
    rows = (there_and_back * 2)[: 3 * n + 5]
    assert torch.equal(model.transformer.wpe.weight, old[rows])


def test_linear_bias_is_minus_slope_times_distance(monkeypatch):
    model = tiny_model()
    hp.patch(model, "linear_bias")
    heads = model.config.num_attention_heads
    slopes = [torch.linspace(0.1, 0.8, heads) * (layer + 1) for layer in range(model.config.num_hidden_layers)]
    biases = [m for m in model.modules() if type(m).__name__ == "SlopeBias"]
    assert len(biases) == model.config.num_hidden_layers  # one learned set of slopes per layer
    with torch.no_grad():
        for bias, values in zip(biases, slopes):
            bias.slopes.copy_(values)
    sdpa = SdpaCalls(monkeypatch)
    with torch.no_grad():
        model(token_ids(12))
    assert sdpa.calls == model.config.num_hidden_layers
    i, j = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    causal = j <= i
    for mask, values in zip(sdpa.masks, slopes):
        expected = -values[:, None, None].double() * (i - j).abs()
        assert torch.allclose(mask[0][:, causal].double(), expected[:, causal], atol=1e-6)
        assert (mask[0][:, ~causal] == torch.finfo(mask.dtype).min).all()
