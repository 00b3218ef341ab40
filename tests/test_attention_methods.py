"""Positions inside attention: alibi, relative_bias, xpos, and learned -> rope.

Each method is checked against a reference written here (the ALiBi paper's slopes, T5's own bucket
function, Shaw et al.'s clipped table, a model with its positions zeroed by hand, plain RoPE), then through
the model: forward, backward, cached generation, save / reload, the SDPA kernel, 4x the original length."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_learned import inputs, tiny
from tiny import tiny_model, token_ids
from transformers import AutoModelForCausalLM
from transformers.models.t5.modeling_t5 import T5Attention

import hf_posenc as hp
from hf_posenc import attention as attention_module
from hf_posenc.attention import CHILD
from hf_posenc.methods.bias import alibi_slopes, bucket_index, clipped_index
from hf_posenc.methods.rope import RotaryQK
from hf_posenc.methods.xpos import XposScale, xpos_zeta
from hf_posenc.plan import is_patched

# (builder, methods) per family: a RoPE causal LM, a learned-table causal LM, a learned-table encoder
CAUSAL_CASES = [
    ("llama", "alibi", {}), ("llama", "relative_bias", {"k": 8}), ("llama", "xpos", {}),
    ("llama", "relative_bias", {"buckets": 16, "max_distance": 64}),
    ("gpt2", "alibi", {}), ("gpt2", "relative_bias", {"k": 8}), ("gpt2", "rope", {}),
    ("opt", "alibi", {}), ("opt", "rope", {"partial_rotary_factor": 0.5}),
]
ENCODER_CASES = [("bert", "alibi", {}), ("bert", "relative_bias", {"buckets": 8, "max_distance": 32}),
                 ("bert", "rope", {}), ("roberta", "alibi", {}), ("distilbert", "relative_bias", {"k": 4})]
CONTEXT = {"llama": 64, "gpt2": 32, "opt": 32, "bert": 32, "roberta": 32, "distilbert": 32}


def build(model_type: str, seed: int = 0):
    return tiny_model(seed=seed) if model_type == "llama" else tiny(model_type, seed=seed)


def ids(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return token_ids(n, batch=batch, vocab=97, seed=seed) + 3  # clear of the special ids, < the vocabulary of 100


def randomize_tables(model, seed: int = 1) -> None:
    """Relative tables start at zero; give them values so the checks see them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if f"{CHILD}." in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.5)


class SdpaCalls:
    """Counts torch's SDPA kernel calls and keeps the last attention mask it got."""

    def __init__(self, monkeypatch):
        self.calls, self.masks = 0, []
        original = torch.nn.functional.scaled_dot_product_attention

        def counting(*args, **kwargs):
            self.calls += 1
            self.masks.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
            return original(*args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)


# -- the math against its references ---------------------------------------------------------------

@pytest.mark.parametrize("heads, expected", [
    (8, [2.0 ** -(i + 1) for i in range(8)]),  # the paper: 1/2, 1/4, ..., 1/256
    (16, [2.0 ** -(0.5 * (i + 1)) for i in range(16)]),  # 1/sqrt(2), 1/2, ...
    # not a power of two: the 8 slopes of 8 heads, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...)
    (12, [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(i + 0.5) for i in range(4)]),
])
def test_alibi_slopes_are_the_papers(heads, expected):
    assert alibi_slopes(heads).tolist() == pytest.approx(expected, rel=1e-12)


def test_alibi_bias_given_to_sdpa_is_minus_slope_times_distance(monkeypatch):
    model = build("llama")
    hp.patch(model, "alibi")
    sdpa = SdpaCalls(monkeypatch)
    with torch.no_grad():
        model(ids(12))
    assert sdpa.calls == model.config.num_hidden_layers  # the SDPA kernel ran, once a layer
    mask = sdpa.masks[-1][0]  # [heads, q, k]
    slopes = alibi_slopes(model.config.num_attention_heads)
    i, j = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    expected = -slopes[:, None, None] * (i - j)
    causal = j <= i
    assert torch.allclose(mask[:, causal].double(), expected[:, causal], atol=1e-6)
    assert (mask[:, ~causal] == torch.finfo(mask.dtype).min).all()


def test_clipped_table_uses_the_edge_value_past_k():
    relative = torch.arange(-20, 21)
    index = clipped_index(relative, 5)
    assert index.tolist() == [0] * 15 + list(range(11)) + [10] * 15


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 20), (16, 64)])
def test_t5_buckets_match_transformers_t5(bidirectional, buckets, max_distance):
    relative = torch.arange(-300, 301)[None, :] - torch.arange(0, 50)[:, None]
    ours = bucket_index(relative, buckets, max_distance, bidirectional)
    theirs = T5Attention._relative_position_bucket(relative, bidirectional, buckets, max_distance)
    assert torch.equal(ours, theirs)


def test_relative_bias_reads_the_table_at_the_clipped_distance(monkeypatch):
    model = build("gpt2")
    hp.patch(model, "relative_bias", k=3)
    randomize_tables(model)
    sdpa = SdpaCalls(monkeypatch)
    with torch.no_grad():
        model(ids(10))
    table = model.transformer.h[-1].attn.hf_posenc_attention.bias.table  # [heads, 7]
    mask = sdpa.masks[-1][0]
    for i in range(10):
        for j in range(i + 1):
            assert torch.equal(mask[:, i, j], table[:, max(-3, min(3, j - i)) + 3])


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
def test_zero_relative_table_is_the_model_without_positions(model_type):
    model = build(model_type)
    reference = build(model_type)
    with torch.no_grad():  # positions removed by hand
        if model_type == "llama":
            reference.model.rotary_emb.inv_freq.zero_()  # cos 1, sin 0: no rotation
        else:
            for table in hp.registry.find_family(reference).tables(reference):
                table.module.weight.zero_()
    hp.patch(model, "relative_bias", k=4)
    batch = {"input_ids": ids(20, batch=2)}
    with torch.no_grad():
        assert torch.allclose(model(**batch)[0], reference(**batch)[0], atol=1e-5)


def rotated_scores(transform, rotary, q: torch.Tensor, k: torch.Tensor, length: int) -> torch.Tensor:
    """S[m, n] = score of q placed at every position m against k at every position n, after rotary (the
    model's own, for XPos) and `transform`."""
    query = q.expand(1, 1, length, -1).clone()
    key = k.expand(1, 1, length, -1).clone()
    if rotary is not None:
        cos, sin = rotary(query, torch.arange(length)[None])
        from hf_posenc.methods.rope import apply_rotary

        query, key = apply_rotary(query, cos[:, None], sin[:, None]), apply_rotary(key, cos[:, None], sin[:, None])
    query, key = transform(query, key)
    return (query @ key.transpose(-1, -2))[0, 0]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.integers(1, 40), extra=st.integers(0, 30))
def test_xpos_score_depends_only_on_the_distance(seed, shift, extra):
    torch.manual_seed(seed)
    model = tiny_model()
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    scale = XposScale(16, 16, gamma=0.4, scale_base=32.0).double()
    rotary = model.model.rotary_emb.double()
    short = rotated_scores(scale, rotary, q, k, 24)
    long = rotated_scores(scale, rotary, q, k, 24 + shift + extra)  # another length: another centre
    # S[m, n] == S[m + s, n + s]: within one input, and across inputs of different lengths
    assert torch.allclose(short, long[shift:shift + 24, shift:shift + 24], rtol=1e-5, atol=1e-5)  # float32 cos/sin
    # and the decay: |m - n| larger -> the high-frequency pairs count less (zeta < 1)
    assert not torch.allclose(short, rotated_scores(lambda a, b: (a, b), rotary, q, k, 24), atol=1e-6)


def test_xpos_zeta_is_the_papers():
    zeta = xpos_zeta(8, 0.4)
    assert zeta.tolist() == pytest.approx([(2 * i / 8 + 0.4) / 1.4 for i in range(4)])


def test_xpos_at_scale_one_is_plain_rope():
    model, reference = build("llama"), build("llama")
    hp.patch(model, "xpos")
    for module in model.modules():
        if isinstance(module, XposScale):
            module.log_zeta.zero_()  # zeta = 1
    batch = ids(30, batch=2)
    with torch.no_grad():
        assert torch.allclose(model(batch).logits, reference(batch).logits, atol=1e-6)
        hp.unpatch(model)
        assert torch.equal(model(batch).logits, reference(batch).logits)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.integers(1, 40))
def test_swapped_rope_score_depends_only_on_the_distance(seed, shift):
    torch.manual_seed(seed)
    model = build("gpt2")
    hp.patch(model, "rope", theta=100.0)
    rotary_qk = next(m for m in model.modules() if isinstance(m, RotaryQK))
    q, k = torch.randn(16), torch.randn(16)
    short = rotated_scores(rotary_qk, None, q, k, 20)
    long = rotated_scores(rotary_qk, None, q, k, 20 + shift)
    assert torch.allclose(short, long[shift:, shift:], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(short[5, 0], short[5, 4])  # it does depend on the distance


@pytest.mark.parametrize("model_type", ["gpt2", "opt", "bert"])
def test_learned_to_rope_is_relative_only(model_type):
    model = build(model_type)
    batch = ids(20, batch=2)
    shifted = torch.arange(20)[None].expand(2, -1) + 7
    with torch.no_grad():
        assert not torch.allclose(model(batch)[0], model(batch, position_ids=shifted)[0], atol=1e-4)  # learned
        hp.patch(model, "rope")
        assert torch.allclose(model(batch)[0], model(batch, position_ids=shifted)[0], atol=1e-6)
    assert hp.describe(model)["mechanism"] == "rope"


# -- through the model -----------------------------------------------------------------------------

@pytest.mark.parametrize("model_type, method, params", CAUSAL_CASES + ENCODER_CASES)
def test_forward_backward_at_4x_the_original_length_on_sdpa(model_type, method, params, monkeypatch):
    model = build(model_type)
    hp.patch(model, method, **params)
    randomize_tables(model)
    assert model.config._attn_implementation == "hf_posenc_sdpa"
    sdpa = SdpaCalls(monkeypatch)
    model.train()
    out = model(ids(4 * CONTEXT[model_type], batch=2))[0]
    assert torch.isfinite(out).all()
    out.float().pow(2).mean().backward()
    assert sdpa.calls >= 2 and all(m is not None and m.dtype != torch.bool for m in sdpa.masks) \
        or method in ("xpos", "rope")
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    if method == "relative_bias":
        assert any(f"{CHILD}." in n and g.abs().sum() > 0 for n, g in grads.items())


@pytest.mark.parametrize("model_type, method, params", [c for c in CAUSAL_CASES if c[1] in ("alibi", "relative_bias")])
def test_query_blocks_give_the_same_output_and_skip_the_keys_ahead(model_type, method, params, monkeypatch):
    """A bias in a causal model runs SDPA per block of queries, each against the keys up to its end."""
    model = build(model_type)
    hp.patch(model, method, **params)
    randomize_tables(model)
    batch = inputs(model, 45, batch=2, pad=6)
    with torch.no_grad():
        whole = model(**batch).logits  # 45 queries: one block
        monkeypatch.setattr(attention_module, "QUERY_BLOCK", 8)
        sdpa = SdpaCalls(monkeypatch)
        split = model(**batch).logits
    layers = model.config.num_hidden_layers
    assert sdpa.calls == 6 * layers  # blocks of 8 queries: 0-7, ..., 40-44
    assert [tuple(m.shape[-2:]) for m in sdpa.masks[:6]] == [(8, 8), (8, 16), (8, 24), (8, 32), (8, 40), (5, 45)]
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(split[keep], whole[keep], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type, method, params", CAUSAL_CASES)
def test_cached_generation_equals_full_forwards(model_type, method, params, monkeypatch):
    monkeypatch.setattr(attention_module, "QUERY_BLOCK", 8)  # the prompt goes in blocks too
    model = build(model_type)
    hp.patch(model, method, **params)
    randomize_tables(model)
    prompt = ids(CONTEXT[model_type], batch=1)
    out = model.generate(prompt, max_new_tokens=12, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        full = model(out.sequences).logits[0, prompt.shape[1] - 1:-1]
    cached = torch.stack(out.scores)[:, 0]
    assert torch.allclose(cached, full, atol=1e-4)


@pytest.mark.parametrize("model_type, method, params", [c for c in CAUSAL_CASES if c[0] != "opt"] + ENCODER_CASES[:3])
def test_padding_and_masks_still_hold(model_type, method, params):
    """A left-padded row gives the same logits as the row alone; eager and SDPA agree."""
    model = build(model_type)
    hp.patch(model, method, **params)
    randomize_tables(model)
    batch = inputs(model, 24, batch=2, pad=5)
    if model_type in ("llama", "gpt2"):
        batch["attention_mask"][0] = 1  # causal models: left padding on the last row only
        batch["input_ids"][0] = ids(24)[0]
    with torch.no_grad():
        both = model(**batch)[0]
        alone = model(input_ids=batch["input_ids"][1:, 5:])[0]
        assert torch.allclose(both[1, 5:], alone[0], atol=1e-5)
        model.config._attn_implementation = "hf_posenc_eager"
        assert torch.allclose(model(**batch)[0][batch["attention_mask"].bool()],
                              both[batch["attention_mask"].bool()], atol=1e-5)


# Save / reload, stock transformers' refusal, unpatch bit for bit: tests/test_contracts.py, for every method.


def test_a_patch_never_reaches_another_model_of_the_same_config():
    model = build("llama")
    other = AutoModelForCausalLM.from_config(model.config, attn_implementation="sdpa").eval()
    other.load_state_dict(model.state_dict())
    hp.patch(model, "alibi")
    assert other.config._attn_implementation == "sdpa"
    batch = ids(16)
    with torch.no_grad():
        assert not torch.allclose(model(batch).logits, other(batch).logits, atol=1e-3)
        assert torch.equal(other(batch).logits, build("llama")(batch).logits)


# -- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("params, error, pattern", [
    ({"k": 0}, hp.InvalidParameterError, "k must be > 0"),
    ({"k": -3}, hp.InvalidParameterError, "k must be > 0"),
    ({"buckets": 32}, hp.InvalidParameterError, "need both buckets= and max_distance="),
    ({"max_distance": 128}, hp.InvalidParameterError, "need both buckets= and max_distance="),
    ({"buckets": 32, "max_distance": 8}, hp.InvalidParameterError, "max_distance=8 must be > buckets // 2"),
    ({"k": 2.5}, hp.ParameterTypeError, "k must be an int"),
])
def test_bad_relative_bias_parameters_are_refused(params, error, pattern):
    model = build("gpt2")
    with pytest.raises(error, match=pattern):
        hp.patch(model, "relative_bias", **params)
    assert not is_patched(model)


@pytest.mark.parametrize("method", ["alibi", "relative_bias"])
def test_a_bias_on_an_attention_kernel_without_one_is_refused(method):
    model = build("llama")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(hp.MethodNotApplicableError, match="take no additive bias"):
        hp.patch(model, method)
    assert not is_patched(model) and not any(CHILD in n for n, _ in model.named_modules())


def test_methods_are_refused_where_they_do_not_apply():
    with pytest.raises(hp.MethodNotApplicableError, match="rope positions"):
        hp.patch(build("llama"), "rope")
    with pytest.raises(hp.MethodNotApplicableError, match="learned positions"):
        hp.patch(build("gpt2"), "xpos")
    with pytest.raises(hp.MethodNotApplicableError, match="attention interface"):
        hp.patch(tiny("gpt_neo"), "alibi")  # GPT-Neo does not call transformers' attention interface
    with pytest.raises(hp.MethodNotApplicableError, match="encoder-decoder"):
        hp.patch(tiny("bart"), "alibi")


STACKED = [("base", {"theta": 1000.0}), ("ntk", {}), ("linear", {}), ("dynamic", {}), ("yarn", {}),
           ("dynamic_yarn", {}), ("llama3", {}), ("longrope", {"long_factor": [1.0, 2.0, 3.0, 4.0]})]


@pytest.mark.parametrize("method, params", STACKED)
def test_every_rope_method_applies_after_learned_to_rope(tmp_path, method, params):
    model = build("gpt2")  # 32 positions, 2 heads of 16 channels
    hp.patch(model, "rope", theta=100.0, partial_rotary_factor=0.5)  # 8 rotary channels: 4 pairs
    batch = ids(4 * 32, batch=2)
    with torch.no_grad():
        swapped = model(batch).logits
        hp.patch(model, method, **({"factor": 4} if method != "base" else {}), **params)
        scaled = model(batch).logits
    record = model.config.hf_posenc
    assert record["method"] == method and record["base"]["method"] == "rope"
    rotary = next(m for m in model.modules() if isinstance(m, RotaryQK)).rotary
    assert hp.describe(model)["rotary_dim"] == 8 and rotary is not None
    if method not in ("dynamic", "dynamic_yarn"):  # transformers built this rotary module from the config
        assert model.config.rope_parameters["rope_type"] == {"base": "default", "ntk": "default"}.get(method, method)
    assert not torch.allclose(scaled, swapped, atol=1e-4)
    model.save_pretrained(tmp_path)
    again = hp.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(again(batch).logits, scaled)
    hp.unpatch(model)  # back to the rope swap, then to the learned table
    with torch.no_grad():
        assert torch.equal(model(batch).logits, swapped)
    assert model.config.hf_posenc["method"] == "rope"
    hp.unpatch(model)
    assert not is_patched(model) and isinstance(model.transformer.wpe, torch.nn.Embedding)
