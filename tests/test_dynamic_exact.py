"""Dynamic scaling under a KV cache: exact_cache=True re-rotates the un-rotated cache with the
current length's frequencies at every step. Reference: the full forward over the same tokens. In a one-layer
model that is exactly what the cache gives; with more layers, the hidden states of earlier tokens were
computed at their own step's length (a cache cannot recompute them), so the gap shrinks but stays."""

from __future__ import annotations

import pytest
import torch
from test_dca import ids
from tiny import tiny_model

import hf_posenc as hp
from hf_posenc.methods.rope import NoRotation
from hf_posenc.plan import is_patched


def stepwise_gap(model, prompt_len: int = 40, total: int = 100, batch: int = 2) -> float:
    """Max |log-prob difference| between a cached step and the full forward over the same tokens."""
    tokens = ids(total, batch=batch)
    worst = 0.0
    with torch.no_grad():
        cache = model(tokens[:, :prompt_len], use_cache=True).past_key_values
        for n in range(prompt_len + 1, total + 1):
            step = model(tokens[:, n - 1:n], past_key_values=cache).logits[:, -1]
            full = model(tokens[:, :n]).logits[:, -1]
            worst = max(worst, (step.log_softmax(-1) - full.log_softmax(-1)).abs().max().item())
    return worst


@pytest.mark.parametrize("method", ["dynamic", "dynamic_yarn"])
def test_one_layer_cache_equals_the_full_forward_at_every_step(method):
    default = hp.patch(tiny_model(num_hidden_layers=1), method, factor=4.0)
    exact = hp.patch(tiny_model(num_hidden_layers=1), method, factor=4.0, exact_cache=True)
    assert stepwise_gap(exact) < 2e-5 < 1e-3 < stepwise_gap(default)


@pytest.mark.parametrize("method", ["dynamic", "dynamic_yarn"])
def test_exact_cache_shrinks_the_gap_in_deeper_models(method):
    default = stepwise_gap(hp.patch(tiny_model(), method, factor=4.0))
    exact = stepwise_gap(hp.patch(tiny_model(), method, factor=4.0, exact_cache=True))
    assert exact < default / 5


def test_generate_with_left_padding_matches_the_full_forward_within_the_original_context():
    """Inside the original context nothing is rescaled: cached generation is the full forward exactly."""
    model = hp.patch(tiny_model(), "dynamic_yarn", factor=4.0, exact_cache=True)
    prompt = ids(30, batch=2)
    mask = torch.ones_like(prompt)
    prompt[1, :6], mask[1, :6] = 0, 0
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=20, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        full = model(out.sequences, attention_mask=torch.cat([mask, torch.ones(2, 20, dtype=mask.dtype)], 1)).logits
    torch.testing.assert_close(torch.stack(out.logits, 1), full[:, 29:-1], atol=1e-4, rtol=1e-4)


def test_inside_the_original_context_it_is_the_unpatched_model():
    model, reference = hp.patch(tiny_model(), "dynamic", factor=2.0, exact_cache=True), tiny_model()
    batch = ids(64, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, reference(batch).logits, atol=1e-5, rtol=1e-5)
    assert isinstance(model.model.rotary_emb, NoRotation)


# Save / reload (exact_cache kept), stock transformers' refusal, unpatch: tests/test_contracts.py.


@pytest.mark.parametrize("value", ["yes", 1])
def test_exact_cache_must_be_a_bool(value):
    model = tiny_model()
    with pytest.raises(hp.ParameterTypeError, match="exact_cache must be a bool"):
        hp.patch(model, "dynamic", factor=2.0, exact_cache=value)
    assert not is_patched(model)


def test_models_whose_attention_cannot_be_wrapped_are_refused():
    model = tiny_model()
    model.config._attn_implementation = "not_an_attention"
    with pytest.raises(hp.MethodNotApplicableError, match="cannot be wrapped"):
        hp.patch(model, "dynamic", factor=2.0, exact_cache=True)
    assert not is_patched(model)
