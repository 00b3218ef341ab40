"""DCA and Self-Extend on a model with one RoPE per layer type: on a tiny Gemma-3 (sliding-window
layers and full-attention layers, nested rope_parameters) they remap the full-attention layers (or the types
`layer_types=` names) and leave the sliding layers as they are. Inside the original context the patched model is
the unpatched one; the remapped layers equal the papers' position matrices with the full-attention RoPE; cached
generation (every cache generate offers) equals the full forward; save -> hp.from_pretrained gives the same logits;
bad `layer_types` values are refused before anything changes."""

from __future__ import annotations

import pytest
import torch
from test_dca import (CACHE_IMPLEMENTATIONS, check_cached_generation, check_padded_row_alone, dca_positions, ids,
                      reference_attention)
from test_self_extend import self_extend_positions
from tiny import tiny_model
from transformers import AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc.methods import remapped
from hf_posenc.methods.remapped import RemappedAttention
from hf_posenc.plan import is_patched

CTX = 64  # the tiny models' original context
WINDOW = 16  # the sliding layers' window: inside the original context
LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
PATCHES = {"dca": {"chunk_size": 16, "local_window": 4}, "self_extend": {"group_size": 3, "window": 12}}
INSIDE = {"dca": 16, "self_extend": 12}  # inputs this long are all intra-chunk / all neighbours


def gemma3(seed: int = 0, **overrides):
    kwargs = {"layer_types": LAYERS, "num_hidden_layers": len(LAYERS), "sliding_window": WINDOW, **overrides}
    return tiny_model("gemma3_text", seed=seed, **kwargs)


def computations(model) -> list[RemappedAttention]:
    return list(dict.fromkeys(m for m in model.modules() if isinstance(m, RemappedAttention)))


@pytest.mark.parametrize("method", list(PATCHES))
def test_only_the_full_attention_layers_are_remapped(method):
    model = hp.patch(gemma3(), method, **PATCHES[method])
    assert hp.describe(model)["params"]["layer_types"] == ["full_attention"]
    children = [layer.self_attn.hf_posenc_attention for layer in model.model.layers]
    assert [child.compute is not None for child in children] == [t == "full_attention" for t in LAYERS]
    assert len(computations(model)) == 1  # one computation shared by the full-attention layers
    rope = model.config.rope_parameters
    assert rope["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}  # untouched
    assert rope["full_attention"]["rope_type"] == f"hf_posenc_{method}"  # stock transformers refuses it


@pytest.mark.parametrize("method", list(PATCHES))
def test_inside_the_original_context_it_is_the_unpatched_model(method):
    model, reference = hp.patch(gemma3(), method, **PATCHES[method]), gemma3()
    batch = ids(INSIDE[method], batch=2)
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, reference(batch).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(batch, attention_mask=mask).logits,
                                   reference(batch, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)
        long = ids(150, batch=2)
        ours, theirs = (m(long, output_hidden_states=True).hidden_states for m in (model, reference))
    # layer 0 slides: the same hidden states at any length; layer 1 is remapped: past the chunk / window it differs
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-6, rtol=1e-6)
    assert (ours[2] - theirs[2]).abs().max() > 1e-4
    assert all(torch.isfinite(h).all() for h in ours)


@pytest.mark.parametrize("method, positions", [
    ("dca", lambda n: dca_positions(n, 16, 4, CTX)),
    ("self_extend", lambda n: self_extend_positions(n, 3, 12)),
])
def test_the_remapped_layers_equal_the_papers_positions_with_the_full_attention_rope(method, positions, monkeypatch):
    monkeypatch.setattr(remapped, "QUERY_BLOCK", 16)
    model, reference = hp.patch(gemma3(), method, **PATCHES[method]), gemma3()
    attention, = computations(model)
    x = torch.zeros(1, 1, 8)
    cos, sin = attention.table(150, x)
    stock_cos, stock_sin = reference.model.rotary_emb(x, torch.arange(150)[None], "full_attention")
    torch.testing.assert_close((cos, sin), (stock_cos[0], stock_sin[0]))  # theta 1e6, not the sliding 1e4
    batch = ids(150, batch=2)
    with torch.no_grad():
        ours = model(batch).logits

        def written_out(query, key, value, scale):
            pq, pk = positions(query.shape[-2])
            return reference_attention(query, key, value, cos, sin, pq, pk, scale).to(query.dtype)

        monkeypatch.setattr(attention, "attend", written_out)
        torch.testing.assert_close(ours, model(batch).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("pad", [0, 7])
@pytest.mark.parametrize("implementation", CACHE_IMPLEMENTATIONS)
@pytest.mark.parametrize("method", list(PATCHES))
def test_cached_generation_equals_the_full_forward_with_every_cache(method, implementation, pad):
    try:
        gemma3().generate(ids(4), max_new_tokens=2, do_sample=False, pad_token_id=0,
                          cache_implementation=implementation)
    except Exception as error:  # noqa: BLE001 - offloaded caches need CUDA, the quantized one optimum-quanto
        pytest.skip(f"transformers cannot generate with cache_implementation={implementation!r} here: {error!r:.120}")
    model = hp.patch(gemma3(), method, **PATCHES[method])
    check_cached_generation(model, row=1, pad=pad, cache_implementation=implementation)


@pytest.mark.parametrize("method", list(PATCHES))
def test_a_left_padded_row_is_the_row_alone(method):
    check_padded_row_alone(hp.patch(gemma3(), method, **PATCHES[method]), row=1, pad=9)


@pytest.mark.parametrize("method", list(PATCHES))
def test_save_and_reload(method, tmp_path):
    model = hp.patch(gemma3(), method, **PATCHES[method])
    model.save_pretrained(tmp_path)
    again = hp.from_pretrained(tmp_path)
    assert hp.describe(again)["params"] == hp.describe(model)["params"]
    assert again.config.rope_parameters == model.config.rope_parameters
    batch = ids(150, batch=2)
    with torch.no_grad():
        assert torch.equal(model(batch).logits, again(batch).logits)
    with pytest.raises((KeyError, RuntimeError, ValueError)):  # stock transformers has no such RoPE
        AutoModelForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("method", list(PATCHES))
def test_unpatch_gives_the_model_back(method):
    model, reference = gemma3(), gemma3()
    rope = dict(model.config.rope_parameters)
    hp.unpatch(hp.patch(model, method, **PATCHES[method]))
    assert not is_patched(model) and model.config.rope_parameters == rope
    batch = ids(150, batch=2)
    with torch.no_grad():
        assert torch.equal(model(batch).logits, reference(batch).logits)


@pytest.mark.parametrize("method", list(PATCHES))
def test_layer_types_given_as_the_default_is_the_default(method):
    one = hp.patch(gemma3(), method, **PATCHES[method])
    two = hp.patch(gemma3(), method, layer_types="full_attention", **PATCHES[method])
    batch = ids(100)
    with torch.no_grad():
        assert torch.equal(one(batch).logits, two(batch).logits)


@pytest.mark.parametrize("method", list(PATCHES))
@pytest.mark.parametrize("layer_types, error, pattern", [
    (["sliding_attention"], hp.InvalidParameterError, "attend within a sliding window"),
    (["full_attention", "sliding_attention"], hp.InvalidParameterError, "attend within a sliding window"),
    (["global"], hp.InvalidParameterError, r"\['global'\] not in this gemma3_text model's RoPE layer types"),
    ([], hp.ParameterTypeError, "layer_types must be a non-empty list of str"),
    ([3], hp.ParameterTypeError, "layer_types must be a non-empty list of str"),
    (7, hp.ParameterTypeError, "layer_types must be a non-empty list of str"),
    (["full_attention", "full_attention"], hp.InvalidParameterError, "lists a type twice"),
])
def test_bad_layer_types_are_refused_before_anything_changes(method, layer_types, error, pattern):
    model = gemma3()
    with pytest.raises(error, match=pattern):
        hp.patch(model, method, layer_types=layer_types, **PATCHES[method])
    assert not is_patched(model) and model.config._attn_implementation == "sdpa"
    assert not any("hf_posenc" in name for name, _ in model.named_modules())


@pytest.mark.parametrize("method", list(PATCHES))
def test_layer_types_on_a_model_with_one_rope_is_refused(method):
    model = tiny_model("llama")
    with pytest.raises(hp.InvalidParameterError, match="has one RoPE for all layers; leave layer_types unset"):
        hp.patch(model, method, layer_types=["full_attention"], **PATCHES[method])
    assert not is_patched(model)


@pytest.mark.parametrize("method", list(PATCHES))
def test_a_sliding_window_longer_than_the_original_context_is_refused(method):
    model = gemma3(sliding_window=2 * CTX)  # past the context, the sliding layers would see untrained distances
    with pytest.raises(hp.MethodNotApplicableError, match="longer than the model's original context 64"):
        hp.patch(model, method, **PATCHES[method])
    assert not is_patched(model)


def test_flat_records_keep_their_format():
    """A model with one RoPE records no layer_types (checkpoints read as before the parameter existed)."""
    model = hp.patch(tiny_model("llama"), "dca", chunk_size=24, local_window=4)
    assert hp.describe(model)["params"] == {"chunk_size": 24, "local_window": 4}
