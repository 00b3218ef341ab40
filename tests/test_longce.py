"""LongCE (hf_posenc/train/losses.py; Fang et al., ICLR 2025) against references written out by hand on a tiny Llama:
the weights are min(exp(loss_short - loss_long), clip), 1 where the losses are equal or no short window
exists; the short losses are forwards of the short windows alone, at the long pass's ids; the loss and its
gradients are the weighted mean. LongPPL (hf_posenc/eval/longppl.py) against its definition, and bad input to it
refused in one line naming the argument. The recipe's train.loss=longce: tests/test_finetune_long.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import hf_posenc as hp
from hf_posenc.causal_lm import short_context_losses
from hf_posenc.eval import longppl as lp
from hf_posenc.train.losses import LongCE, TrainingLoss, longce_loss, longce_weights
from refusals import IDS, CallCase, encoder, llama, refused_in_one_line, table, tok
from tiny import tiny_model, token_ids

pytestmark = pytest.mark.usefixtures("one_thread")

N, WINDOW, STRIDE = 40, 8, 6


def test_the_weights_are_the_clipped_probability_ratio():
    long = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0, 0.2])
    short = torch.tensor([1.0, 2.0 + math.log(2), 9.0, 3.0 - math.log(4), float("nan"), 0.2])
    weights = longce_weights(long, short, clip=5.0)
    torch.testing.assert_close(weights, torch.tensor([1.0, 2.0, 5.0, 0.25, 1.0, 1.0]))
    assert weights[0] == 1 and weights[-1] == 1   # equal losses: exactly 1
    assert longce_weights(torch.tensor([0.0]), torch.tensor([1e4]), clip=3.0).item() == 3.0   # no overflow


def test_a_floor_bounds_the_weights_from_below_and_leaves_the_rest():
    long = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0, 0.2])
    short = torch.tensor([1.0, 2.0 + math.log(2), 9.0, 3.0 - math.log(4), float("nan"), 3.0 - math.log(2)])
    torch.testing.assert_close(longce_weights(long, short, clip=5.0, floor=0.5),
                               torch.tensor([1.0, 2.0, 5.0, 0.5, 1.0, 5.0]))
    floored = longce_weights(long, short, clip=5.0, floor=1.0)   # the long context only ever adds weight
    torch.testing.assert_close(floored, torch.tensor([1.0, 2.0, 5.0, 1.0, 1.0, 5.0]))
    assert torch.equal(longce_weights(long, short, clip=5.0, floor=0.0), longce_weights(long, short, clip=5.0))


def reference_short_losses(model, ids, window, stride, position_ids=None):
    """Token t's loss from a forward of tokens a .. t-1 alone, a = the start of the window scoring t
    (windows of window + stride tokens at stride, 2 stride, ...); NaN for t < window + stride."""
    n = ids.shape[1]
    positions = torch.arange(n)[None] if position_ids is None else position_ids
    out = torch.full((ids.shape[0], n - 1), float("nan"))
    with torch.no_grad():
        for t in range(window + stride, n):
            a = (t - window) // stride * stride
            logits = model(ids[:, a:t], position_ids=positions[:, a:t]).logits[:, -1]
            out[:, t - 1] = F.cross_entropy(logits.float(), ids[:, t], reduction="none")
    return out


def test_the_short_losses_are_forwards_of_the_short_windows_alone():
    model = tiny_model()
    ids = token_ids(N, batch=2)
    ours = short_context_losses(model, ids, torch.ones_like(ids), WINDOW, STRIDE, chunk=5)
    expected = reference_short_losses(model, ids, WINDOW, STRIDE)
    torch.testing.assert_close(ours, expected, equal_nan=True, rtol=1e-4, atol=1e-5)
    assert torch.isnan(ours[:, :WINDOW + STRIDE - 1]).all() and not torch.isnan(ours[:, WINDOW + STRIDE - 1:]).any()


def test_the_short_windows_keep_the_long_passs_ids():
    """A position scheme's ids (spread, as PoSE gives them): each window is run at its tokens' own ids."""
    model = tiny_model()
    ids = token_ids(N, batch=1)
    spread = torch.cat([torch.arange(20), torch.arange(20) + 37])[None]
    ours = short_context_losses(model, ids, torch.ones_like(ids), WINDOW, STRIDE, position_ids=spread)
    torch.testing.assert_close(ours, reference_short_losses(model, ids, WINDOW, STRIDE, spread), equal_nan=True,
                               rtol=0, atol=5e-6)
    # the windows straddling the jump of the ids at token 20 score otherwise at 0..n-1 (RoPE is relative: a
    # window inside one run of ids scores the same at any offset)
    contiguous = reference_short_losses(model, ids, WINDOW, STRIDE)
    assert (ours - contiguous).nan_to_num().abs().max() > 1e-3


def reference_loss(model, ids, mask, clip, position_ids=None, floor=0.0):
    logits = model(ids, attention_mask=mask, position_ids=position_ids).logits[:, :-1].float()
    labels = ids.masked_fill(mask == 0, -100)[:, 1:]
    losses = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none")
    losses = losses.view(labels.shape)
    short = reference_short_losses(model, ids, WINDOW, STRIDE, position_ids)
    short = short.masked_fill(labels == -100, float("nan"))
    ratio = torch.exp(short - losses.detach())
    weights = torch.where(torch.isnan(short), 1.0, ratio.clamp(max=clip).clamp(min=floor))
    return (weights * losses).sum() / (labels != -100).sum(), weights


@pytest.mark.parametrize("chunk, floor", [(0, 0.0), (7, 0.0), (7, 0.95)])
def test_the_loss_and_its_gradients_are_the_weighted_mean(chunk, floor):
    torch.manual_seed(0)
    model = tiny_model()
    ids = token_ids(N, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 33:] = 0   # padding: neither weighted nor counted
    longce = LongCE(WINDOW, STRIDE, clip=1.1, floor=floor)   # the random model's ratios are 0.9-1.15
    model.train()
    ours = longce_loss(model, ids, mask, longce, chunk)
    ours.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected, weights = reference_loss(model, ids, mask, 1.1, floor=floor)
    expected.backward()
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
    # the reference is not the plain loss: some weights are clipped, some below 1 (or at the floor)
    assert (weights == 1.1).any() and (weights < 1).any() and (not floor or (weights == floor).any())
    assert model.training and all(m.training for m in model.modules())   # the short pass gave the mode back


def test_a_window_longer_than_the_sequence_is_the_plain_loss():
    """No token has a shorter context: every weight is 1, the loss is the cross-entropy, bit for bit."""
    model = tiny_model()
    ids = token_ids(N)
    mask = torch.ones_like(ids)
    plain = TrainingLoss(model, objective="lm", causal=True, chunk=8)(ids, mask)
    weighted = TrainingLoss(model, objective="lm", causal=True, chunk=8, longce=LongCE(N - STRIDE, STRIDE))(ids, mask)
    assert torch.equal(plain, weighted)


def test_the_short_pass_has_no_dropout_and_keeps_the_rng():
    """Eval mode for the short windows: dropout in the model changes the long pass only, and the same seed
    gives the same loss (what a resumed run needs)."""
    model = tiny_model(attention_dropout=0.5).train()
    ids = token_ids(N)
    mask = torch.ones_like(ids)
    shorts = [short_context_losses(model, ids, mask, WINDOW, STRIDE) for _ in range(2)]
    torch.testing.assert_close(shorts[0], shorts[1], equal_nan=True, rtol=0, atol=0)
    losses = []
    for _ in range(2):
        torch.manual_seed(5)
        losses.append(longce_loss(model, ids, mask, LongCE(WINDOW, STRIDE), chunk=8))
    assert torch.equal(losses[0], losses[1])


@pytest.mark.parametrize("kwargs, message", [
    ({"window": 0, "stride": 4}, "window must be an int >= 1"),
    ({"window": 8, "stride": 2.5}, "stride must be an int >= 1"),
    ({"window": 8, "stride": 4, "clip": 0.5}, "clip must be a number >= 1"),
    ({"window": 8, "stride": 4, "clip": float("inf")}, "clip must be a number >= 1"),
    ({"window": 8, "stride": 4, "floor": -0.1}, "floor must be a number in \\[0, 1\\]"),
    ({"window": 8, "stride": 4, "floor": 1.5}, "floor must be a number in \\[0, 1\\]"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LongCE(**kwargs)


def test_longce_is_for_the_lm_objective():
    with pytest.raises(ValueError, match="objective lm only"):
        TrainingLoss(tiny_model(), objective="distill", causal=True, longce=LongCE(8, 4))


# ---------------------------------------------------------------------------------------------------- LongPPL
TEXT = ("Now is the winter of our discontent made glorious summer by this sun of York; and all the clouds that "
        "lour'd upon our house in the deep bosom of the ocean buried.")


@pytest.fixture(scope="module")
def text_model():
    from tiny import TINY_TEXT_VOCAB, tiny_tokenizer

    return tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=256), tiny_tokenizer()


def test_key_tokens_pass_both_thresholds():
    from hf_posenc.eval.longppl import key_tokens

    long = torch.tensor([0.5, 0.5, 3.0, 0.5, 1.0])
    short = torch.tensor([3.0, 2.4, 6.0, float("nan"), 3.5])
    # LSD: 2.5, 1.9, 3.0, -, 2.5; LCL: -0.5, -0.5, -3.0, -0.5, -1.0
    assert key_tokens(long, short).tolist() == [True, False, False, False, True]


def test_longppl_is_the_perplexity_of_the_key_tokens(text_model):
    """The model as its own evaluator, against the definition written out: the key tokens from its long and
    short losses, the perplexity of the model's long losses on them."""
    from hf_posenc.eval.longppl import longppl

    model, tokenizer = text_model
    alpha, beta = 0.01, -10.0   # a random tiny model: a low bar, so that some tokens pass it
    result = longppl(model, tokenizer, [TEXT], short_window=16, stride=8, alpha=alpha, beta=beta, max_length=120)
    ids = torch.tensor([tokenizer(TEXT, add_special_tokens=False)["input_ids"][:120]])
    with torch.no_grad():
        long = F.cross_entropy(model(ids).logits[0, :-1].float(), ids[0, 1:], reduction="none")
    short = reference_short_losses(model, ids, 16, 8)[0]
    key = ~torch.isnan(short) & (short - long > alpha) & (-long > beta)
    assert 0 < key.sum() < 119 - 23
    assert result["key_tokens"] == int(key.sum()) and result["tokens"] == 119
    assert result["longppl"] == pytest.approx(math.exp(long[key].mean().item()), rel=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(long.mean().item()), rel=1e-5)


def test_another_evaluator_tokenizer_carries_the_key_tokens_by_their_characters(text_model):
    """An evaluator with its own tokenizer object (the same bytes here): the key tokens mapped through the
    characters are the ones found token by token."""
    from hf_posenc.eval.longppl import longppl
    from tiny import tiny_tokenizer

    model, tokenizer = text_model
    settings = dict(short_window=16, stride=8, alpha=0.01, beta=-10.0, max_length=120)
    direct = longppl(model, tokenizer, [TEXT, TEXT[40:]], **settings)
    mapped = longppl(model, tokenizer, [TEXT, TEXT[40:]], evaluator=model, evaluator_tokenizer=tiny_tokenizer(),
                     **settings)
    assert mapped["key_tokens"] == direct["key_tokens"] > 0
    assert mapped["longppl"] == pytest.approx(direct["longppl"], rel=1e-6)
    # a stricter evaluator finds fewer key tokens
    assert longppl(model, tokenizer, [TEXT], **{**settings, "alpha": 0.2})["key_tokens"] < direct["key_tokens"]


@pytest.mark.parametrize("kwargs, message", [
    ({"short_window": 120}, "short_window=120 must be shorter"),
    ({"short_window": 0}, "short_window must be an int >= 1"),
    ({"alpha": float("nan")}, "alpha must be a finite number"),
    ({"stride": 2.5}, "stride must be an int >= 1"),
    ({"texts": "a string"}, "texts must be a non-empty list"),
    ({"texts": []}, "texts must be a non-empty list"),
])
def test_longppl_refuses_bad_input(text_model, kwargs, message):
    from hf_posenc.errors import PosEncError
    from hf_posenc.eval.longppl import longppl

    model, tokenizer = text_model
    texts = kwargs.pop("texts", [TEXT])
    with pytest.raises(PosEncError, match=message):
        longppl(model, tokenizer, texts, max_length=120, **kwargs)


def test_the_default_evaluator_window_is_the_native_context(text_model):
    import hf_posenc as hp
    from hf_posenc.eval.longppl import native_window

    model, _ = text_model
    assert native_window(model) == 256
    patched = tiny_model(max_position_embeddings=64)
    hp.patch(patched, "yarn", max_position_embeddings=256)
    assert native_window(patched) == 64


# -- wrong-type, empty and out-of-range input to LongPPL: one line naming the argument ----------------------------

def text_longppl(model, **kw):
    return lp.longppl(model, tok(), ["hello world " * 10], short_window=4, max_length=32, **kw)


CALL_CASES = [
    # eval.longppl
    CallCase("longppl-encoder", lambda: text_longppl(encoder()), hp.UnsupportedModelError,
             "longppl: model is a BertForMaskedLM (bert), not a causal LM"),
    CallCase("longppl-past-the-vocabulary", lambda: text_longppl(tiny_model()), hp.InvalidInputError,
             "texts[0]'s token ids hold token ids"),
    CallCase("longppl-no-tokenizer",
             lambda: lp.longppl(llama(), None, ["hello world " * 10], short_window=4, max_length=32),
             hp.InvalidInputError, "longppl tokenizer must be a transformers tokenizer (hp.load_tokenizer), got None"),
    CallCase("longppl-no-model", lambda: text_longppl(None), hp.InvalidInputError,
             "longppl: model must be a transformers causal LM"),
    CallCase("longppl-past-the-table", lambda: lp.longppl(table(), tok(), ["hello world " * 10], short_window=4,
                                                          max_length=64), hp.SequenceTooLongError,
             "is longer than this model's learned position table, which holds 32 positions"),
    CallCase("token_losses-encoder", lambda: lp.token_losses(encoder(), IDS), hp.UnsupportedModelError,
             "not a causal LM"),
    CallCase("key_tokens-alpha-a-str", lambda: lp.key_tokens(torch.zeros(3), torch.zeros(3), alpha="a"),
             hp.InvalidParameterError, "longppl alpha must be a finite number, got 'a'"),
    CallCase("key_tokens-lengths-differ", lambda: lp.key_tokens(torch.zeros(5), torch.zeros(4)), hp.InvalidInputError,
             "tensors of one shape, got (5,) and (4,)"),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[c.id for c in CALL_CASES])
def test_bad_input_to_the_python_api_is_refused_in_one_line(case):
    refused_in_one_line(case)
