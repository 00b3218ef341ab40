"""S2-Attn (hf_posenc/train/s2_attention.py; Chen et al., ICLR 2024, "LongLoRA") against references built by hand:
eager attention under the mask of the groups each head should see (the plain groups for the first ceil(h/2)
heads, the groups moved by g/2 for the others), on the function and on a tiny model of every RoPE family;
one group without the shift is full attention; evaluation and the saved model use full attention.
The recipe's train.attention=s2: tests/test_finetune_long.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc import _compat
from hf_posenc.train import s2_attention as s2
from hf_posenc.errors import InvalidParameterError, MethodNotApplicableError
from test_rope_families import FAMILIES
from tiny import tiny_config, tiny_model, token_ids

pytestmark = pytest.mark.usefixtures("one_thread")


def group_mask(n: int, heads: int, group: int, shift: bool = True) -> torch.Tensor:
    """[heads, n, n] bool, True where query i may see key j: causal, inside i's group. The shifted heads (the
    last heads // 2) have the groups moved by g/2: [g/2, 3g/2), ..., and [0, g/2) with [n - g/2, n)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    groups = n // group
    plain = (i // group == j // group) & (j <= i)
    moved = ((i + group // 2) // group % groups == (j + group // 2) // group % groups) & (j <= i)
    shifted = heads // 2 if shift else 0
    return torch.stack([plain] * (heads - shifted) + [moved] * shifted)


def eager(query, key, value, allowed, scaling):
    """softmax(q k^T * scaling, where allowed) v, key / value heads repeated for grouped-query attention."""
    repeat = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    scores = (query @ key.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ value


def qkv(b=2, heads=5, kv_heads=1, n=24, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, heads, n, d, generator=g), torch.randn(b, kv_heads, n, d, generator=g),
            torch.randn(b, kv_heads, n, d, generator=g))


# ------------------------------------------------------------------------------------------- the function
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (5, 1), (2, 2)])
def test_each_head_sees_exactly_its_groups(heads, kv_heads):
    """The first ceil(h/2) heads: [0, 8), [8, 16), [16, 24); the others [0, 4), [4, 12), [12, 20), [20, 24)."""
    query, key, value = qkv(heads=heads, kv_heads=kv_heads)
    out = s2.grouped_attention(query, key, value, None, 8, scaling=0.3)
    expected = eager(query, key, value, group_mask(24, heads, 8)[None], 0.3)
    torch.testing.assert_close(out, expected)
    # the reference is not trivially met: the shifted heads differ from the plain groups' answer
    plain = eager(query, key, value, group_mask(24, heads, 8, shift=False)[None], 0.3)
    assert not torch.allclose(out[:, heads - heads // 2:], plain[:, heads - heads // 2:])


def test_the_wrapped_group_keeps_the_order_of_the_sequence():
    """The shifted heads' last group holds the first g/2 tokens and the last g/2 (the paper's roll), causal in
    the sequence's order: the first tokens see none of the last ones (under the paper's mask in rolled order
    they would read the end of the sequence), the last ones see the first."""
    allowed = group_mask(16, 2, 8)[1]
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.equal(allowed[:4, :4], causal) and not allowed[:4, 4:].any()
    assert allowed[12:, :4].all() and torch.equal(allowed[12:, 12:], causal) and not allowed[12:, 4:12].any()
    query, key, value = qkv(heads=2, kv_heads=2, n=16)
    changed = value.clone()
    changed[:, :, 12:] += 1.0   # the last tokens' values: the first tokens must not move
    first = s2.grouped_attention(query, key, value, None, 8)
    second = s2.grouped_attention(query, key, changed, None, 8)
    torch.testing.assert_close(first[:, :, :12], second[:, :, :12])
    assert s2.group_order(16, 8, 2).tolist() == [list(range(16)), [*range(4, 12), *range(4), *range(12, 16)]]


@pytest.mark.parametrize("shift", [False, True])
def test_one_group_is_full_causal_attention(shift):
    query, key, value = qkv(heads=4, kv_heads=2, n=16)
    out = s2.grouped_attention(query, key, value, None, 16, shift=shift, scaling=0.25)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1), is_causal=True, scale=0.25)
    torch.testing.assert_close(out, expected)


def test_the_models_mask_is_kept_inside_the_groups():
    """Padding (bool, as SDPA takes it, and float, additive) and a window: the groups AND the model's mask."""
    n, heads = 16, 4
    query, key, value = qkv(heads=heads, kv_heads=2, n=n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    padded = causal & (torch.arange(n) < 13)[None, :]          # row 0 of the batch: keys 13.. are padding
    window = causal & (torch.arange(n)[:, None] - torch.arange(n)[None, :] < 3)
    model_mask = torch.stack([padded, window])[:, None]       # [2, 1, n, n]
    out = s2.grouped_attention(query, key, value, model_mask, 8)
    expected = eager(query, key, value, group_mask(n, heads, 8)[None] & model_mask, key.shape[-1] ** -0.5)
    torch.testing.assert_close(out[0, :, :13], expected[0, :, :13])   # real queries of row 0
    torch.testing.assert_close(out[1], expected[1])
    assert torch.isfinite(out).all()                          # padding queries stay finite
    additive = torch.zeros(model_mask.shape).masked_fill(~model_mask, torch.finfo(torch.float32).min)
    torch.testing.assert_close(s2.grouped_attention(query, key, value, additive, 8), out)
    per_head = model_mask.expand(2, heads, n, n)   # a mask of each head's own
    torch.testing.assert_close(s2.grouped_attention(query, key, value, per_head, 8), out)


def test_gradients_flow_through_every_group():
    query, key, value = (t.requires_grad_() for t in qkv(heads=4, kv_heads=2, n=16))
    s2.grouped_attention(query, key, value, None, 8).square().sum().backward()
    reference = [t.detach().clone().requires_grad_() for t in (query, key, value)]
    eager(*reference, group_mask(16, 4, 8)[None], 8 ** -0.5).square().sum().backward()
    for ours, theirs in zip((query, key, value), reference):
        torch.testing.assert_close(ours.grad, theirs.grad)


@pytest.mark.parametrize("group, length, message", [
    (6, 16, "does not divide the sequence of 16 tokens"),
    (32, 16, "larger than the sequence of 16 tokens"),
    (5, None, "must be even"),
    (1, None, "int >= 2"),
    (True, None, "int >= 2"),
])
def test_impossible_groups_are_refused(group, length, message):
    with pytest.raises(InvalidParameterError, match=message):
        s2.check_group(group, length)


# ---------------------------------------------------------------------------------------------- on models
def reference_attention(mask_of):
    """An attention function: eager under the model's own mask (SDPA's: None is causal) AND mask_of(n, heads);
    a query always sees itself (a padding query whose group holds only padding stays finite)."""
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        n, heads = query.shape[2], query.shape[1]
        own = torch.ones(n, n, dtype=torch.bool).tril()[None, None] if attention_mask is None else attention_mask
        if own.dtype != torch.bool:
            own = own > torch.finfo(own.dtype).min / 2
        allowed = own & mask_of(n, heads)[None] | torch.eye(n, dtype=torch.bool)
        out = eager(query, key, value, allowed, scaling or query.shape[-1] ** -0.5)
        return out.transpose(1, 2).contiguous(), None
    return attention


def use(model, name: str) -> None:
    for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
        _compat.set_attention_implementation(config, name)


def build(model_type: str, **extra):
    overrides = {k: v for k, v in FAMILIES[model_type].items() if k != "attn_implementation"}
    torch.manual_seed(0)
    config = tiny_config(model_type, **{**overrides, **extra})
    config.attention_dropout = 0.0
    return AutoModelForCausalLM.from_config(
        config, attn_implementation=FAMILIES[model_type].get("attn_implementation", "sdpa"))


GROUPABLE = [t for t in FAMILIES if t != "gemma2"]


@pytest.mark.parametrize("model_type", GROUPABLE)
def test_every_rope_family_trains_on_the_groups_and_evaluates_on_everything(model_type):
    """In training mode the model computes what eager attention under the groups' mask computes; in eval mode
    (and after disable) it is the model it was, bit for bit."""
    model = build(model_type)
    ids = token_ids(32, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 28:] = 0   # padding in one row
    model.eval()
    before = model(ids, attention_mask=mask).logits
    s2.enable(model, 8)
    assert _compat.attention_implementation(model.config.get_text_config()) == s2.NAME
    torch.testing.assert_close(model(ids, attention_mask=mask).logits, before, rtol=0, atol=0)   # eval: full
    model.train()
    grouped = model(ids, attention_mask=mask).logits
    _compat.register_attention("test_s2_reference", reference_attention(lambda n, h: group_mask(n, h, 8)), "sdpa")
    use(model, "test_s2_reference")
    expected = model(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(grouped[real], expected[real], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(grouped[real], before[real], atol=1e-3)   # the groups change the answer
    use(model, s2.NAME)
    s2.disable(model)
    assert _compat.attention_implementation(model.config.get_text_config()) == "sdpa"
    assert not any(hasattr(m, s2.SETTINGS) for m in model.modules())
    model.eval()
    torch.testing.assert_close(model(ids, attention_mask=mask).logits, before, rtol=0, atol=0)


@pytest.mark.parametrize("shift", [False, True])
def test_one_group_trains_as_full_attention(shift):
    model = tiny_model().train()
    ids = token_ids(32)
    full = model(ids).logits
    s2.enable(model, 32, shift=shift)
    torch.testing.assert_close(model(ids).logits, full)


def test_gradient_checkpointing_recomputes_the_same_groups():
    model = tiny_model().train()
    ids = token_ids(32)
    s2.enable(model, 8)
    model(ids, labels=ids).loss.backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model(ids, labels=ids).loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[n], msg=n)


def test_generation_and_a_saved_model_use_full_attention(tmp_path):
    model = tiny_model()
    ids = token_ids(13)
    expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    s2.enable(model, 4)
    model.train()   # training mode, but a cache: one query, 13 keys
    with torch.no_grad():
        logits = model(ids[:, :1], past_key_values=model(ids[:, :-1], use_cache=True).past_key_values).logits
    model.eval()
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)
    assert torch.isfinite(logits).all()
    s2.disable(model)
    model.save_pretrained(tmp_path)
    assert s2.NAME not in (tmp_path / "config.json").read_text()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert _compat.attention_implementation(reloaded.config) == "sdpa"


def test_a_patched_rope_model_and_peft_lora_take_it():
    peft = pytest.importorskip("peft")
    model = tiny_model()
    hp.patch(model, "yarn", max_position_embeddings=128)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    s2.enable(model, 8)
    assert s2.enabled(model)
    model.train()
    ids = token_ids(32)
    model(input_ids=ids, labels=ids).loss.backward()
    assert any(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)
    s2.disable(model)
    assert not s2.enabled(model) and hp.describe(model)["method"] == "yarn"


@pytest.mark.parametrize("case, message", [
    ("gemma2", "soft-capped"),
    ("alibi", "posenc attention method"),
    ("bert", "bidirectional"),
    ("one head", "one attention head"),
])
def test_models_whose_attention_cannot_be_grouped_are_refused_untouched(case, message):
    if case == "gemma2":
        model = build("gemma2")
    elif case == "alibi":
        model = tiny_model()
        hp.patch(model, "alibi")
    elif case == "bert":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32))
    else:
        model = tiny_model(num_attention_heads=1, num_key_value_heads=1, head_dim=64)
    implementation = _compat.attention_implementation(model.config.get_text_config())
    with pytest.raises(MethodNotApplicableError, match=message):
        s2.enable(model, 8)
    assert _compat.attention_implementation(model.config.get_text_config()) == implementation
    assert not any(hasattr(m, s2.SETTINGS) for m in model.modules())


def test_enabling_again_changes_the_group_and_disable_still_restores_the_original():
    model = tiny_model()
    _compat.set_attention_implementation(model.config, "eager")
    s2.enable(model, 8)
    s2.enable(model, 16, shift=False)
    assert {getattr(m, s2.SETTINGS) for _, m in _compat.attention_modules(model)} == {s2.S2Settings(16, False)}
    s2.disable(model)
    assert _compat.attention_implementation(model.config) == "eager" and not s2.enabled(model)
    s2.disable(model)   # off already: nothing to do
    assert _compat.attention_implementation(model.config) == "eager"
