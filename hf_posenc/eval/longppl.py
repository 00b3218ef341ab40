"""LongPPL (Fang et al., ICLR 2025, "What is Wrong with Perplexity for Long-context Language Modeling?"):
perplexity on the key tokens only, the tokens the long context is needed for.

An evaluator model reads each text twice: given everything before each token (the long context) and given
only a short window of it. A token is a key token when the long context helps it a lot and it is predicted
well with it (the paper's Eq. for LSD / LCL, alpha = 2, beta = -2):

    LSD_t = log P(x_t | x_<t) - log P(x_t | the short window)  > alpha
    LCL_t = log P(x_t | x_<t)                                   > beta

LongPPL = exp(mean over the key tokens of -log P_model(x_t | x_<t)), the evaluated model's loss on them, all
texts pooled. The evaluator is any causal LM the user names; by default the model itself at its native window
(the context before its patch), the paper's "the model itself" variant. The short windows are cut as LongCE's
(hf_posenc.causal_lm.short_context_losses: windows of window + stride tokens, each token with window ..
window + stride - 1 tokens of context, at their own ids). With another tokenizer than the evaluated model's,
the key tokens are carried over by their characters (a token of the evaluated model counts when its characters
lie inside a key token's, both fast tokenizers).

    from hf_posenc.eval.longppl import longppl
    longppl(model, tokenizer, [text], max_length=32768)                   # the model as its own evaluator
    longppl(model, tokenizer, [text], evaluator=big, evaluator_tokenizer=big_tok, short_window=4096)
"""

from __future__ import annotations

import bisect
import math

import torch

from .. import api
from ..causal_lm import (check_causal_lm, check_token_ids, evaluating, hidden_states, next_token_losses,
                         short_context_losses)
from ..errors import InvalidInputError, InvalidParameterError
from .perplexity import check_length


@torch.no_grad()
def token_losses(model, input_ids: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """-log P(x_t | x_<t) of each token t >= 1 of `input_ids` [1, n], given all of them; [n - 1], float."""
    check_causal_lm(model, "token_losses")
    with evaluating(model):
        mask = torch.ones_like(input_ids)
        hidden = hidden_states(model, input_ids, mask)[:, :-1]
        return next_token_losses(model, hidden, input_ids[:, 1:], chunk)[0]


def native_window(model) -> int:
    """The context the model had before its hf_posenc patch (its own context when unpatched)."""
    described = api.describe(model)
    return int(described.get("original_max_position_embeddings") or described["max_position_embeddings"])


def key_tokens(long: torch.Tensor, short: torch.Tensor, alpha: float = 2.0, beta: float = -2.0) -> torch.Tensor:
    """The key tokens (bool, like `long`): LSD = short - long > alpha and LCL = -long > beta; a token with no
    short window (NaN) is not one."""
    _check("alpha", alpha)
    _check("beta", beta)
    if not (torch.is_tensor(long) and torch.is_tensor(short)) or long.shape != short.shape:
        raise InvalidInputError(f"longppl key_tokens needs each token's long and short loss as tensors of one shape, "
                                f"got {tuple(getattr(long, 'shape', ()))} and {tuple(getattr(short, 'shape', ()))}")
    return ~torch.isnan(short) & (short - long > alpha) & (-long > beta)


def _check(name: str, value, *, low: float | None = None, integer: bool = False, optional: bool = False) -> None:
    if value is None and optional:
        return
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) \
            or (low is not None and value < low):
        what = "an int" if integer else "a finite number"
        raise InvalidParameterError(f"longppl {name} must be {what}{f' >= {low}' if low is not None else ''}"
                                    f"{' (or None)' if optional else ''}, got {value!r}")


def _encode(tokenizer, text: str, offsets: bool):
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=offsets)
    return encoded["input_ids"], (encoded["offset_mapping"] if offsets else None)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character spans, sorted, the ones that touch or overlap joined (key tokens next to each other are one
    key span: a token of the other tokenizer may cover both)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _inside(spans: list[tuple[int, int]], starts: list[int], span: tuple[int, int]) -> bool:
    """Whether `span` lies inside one of `spans` (sorted by start, not overlapping)."""
    i = bisect.bisect_right(starts, span[0]) - 1
    return i >= 0 and spans[i][0] <= span[0] and span[1] <= spans[i][1]


def longppl(model, tokenizer, texts: list[str], *, evaluator=None, evaluator_tokenizer=None,
            short_window: int | None = None, stride: int | None = None, alpha: float = 2.0, beta: float = -2.0,
            max_length: int | None = None, chunk: int = 1024) -> dict:
    """LongPPL of `model` on `texts` (each cut to its first `max_length` tokens; None: the model's context).
    `evaluator` (None: `model`) finds the key tokens with windows of `short_window` tokens (None: the
    evaluator's native window) scored `stride` at a time (None: a quarter of the window, the paper's 4096 /
    1024). Returns {"longppl": float or None when no token is a key token, "key_tokens": their count,
    "perplexity": over every token, "tokens": the tokens scored, "texts": len(texts)}."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts \
            or not all(isinstance(t, str) and t for t in texts):
        raise InvalidInputError(f"longppl texts must be a non-empty list of non-empty strings, got {texts!r:.80}")
    _check("alpha", alpha)
    _check("beta", beta)
    _check("max_length", max_length, low=2, integer=True, optional=True)
    _check("chunk", chunk, low=1, integer=True)
    check_causal_lm(model, "longppl")
    if evaluator is not None:
        check_causal_lm(evaluator, "longppl's evaluator")
    for name, value in (("tokenizer", tokenizer), ("evaluator_tokenizer", evaluator_tokenizer)):
        if (value is not None or name == "tokenizer") and not callable(value):
            raise InvalidInputError(f"longppl {name} must be a transformers tokenizer (hp.load_tokenizer), got "
                                    f"{value!r:.60}")
    judge = model if evaluator is None else evaluator
    judge_tokenizer = evaluator_tokenizer or tokenizer
    window = native_window(judge) if short_window is None else short_window
    _check("short_window", window, low=1, integer=True)
    stride = max(1, window // 4) if stride is None else stride
    _check("stride", stride, low=1, integer=True)
    length = max_length or int(api.describe(model)["max_position_embeddings"])
    if window >= length:
        raise InvalidParameterError(f"longppl short_window={window} must be shorter than the texts' {length} "
                                    f"tokens (max_length): no token would have a short context")
    by_characters = judge_tokenizer is not tokenizer
    device = next(model.parameters()).device
    judge_device = next(judge.parameters()).device
    encoded = [_encode(tokenizer, text, by_characters) for text in texts]
    encoded = [(ids[:length], offsets and offsets[:length]) for ids, offsets in encoded]
    # the evaluator reads the same characters, with its own tokens
    judged = [_encode(judge_tokenizer, text[:offsets[-1][1]], True) if by_characters and len(ids) >= 2
              else (ids, None) for text, (ids, offsets) in zip(texts, encoded)]
    # every text against both models (their vocabularies, a learned table's end) before the first pass
    for i, ((ids, _), (judge_ids, _)) in enumerate(zip(encoded, judged)):
        check_token_ids(model, torch.tensor(ids), f"texts[{i}]'s token ids")
        check_token_ids(judge, torch.tensor(judge_ids), f"texts[{i}]'s token ids for the evaluator")
    check_length(model, max(len(ids) for ids, _ in encoded))
    check_length(judge, max(len(ids) for ids, _ in judged))
    keys = total = key_total = count = 0
    for (ids, offsets), (judge_ids, judge_offsets) in zip(encoded, judged):
        if len(ids) < 2:
            continue
        ids = torch.tensor([ids], device=device)
        losses = token_losses(model, ids, chunk)
        if by_characters:
            judge_ids = torch.tensor([judge_ids], device=judge_device)
            judge_long = token_losses(judge, judge_ids, chunk)
        else:
            judge_ids, judge_long = ids.to(judge_device), (losses if judge is model else
                                                           token_losses(judge, ids.to(judge_device), chunk))
        judge_short = short_context_losses(judge, judge_ids, torch.ones_like(judge_ids), window, stride,
                                           chunk=chunk)[0]
        found = key_tokens(judge_long, judge_short, alpha, beta).cpu()
        if by_characters:
            spans = _merged([tuple(judge_offsets[t + 1]) for t in found.nonzero().flatten().tolist()])
            starts = [s for s, _ in spans]
            found = torch.tensor([_inside(spans, starts, tuple(span)) for span in offsets[1:]], dtype=torch.bool)
        losses = losses.float().cpu()
        keys += int(found.sum())
        key_total += float(losses[found].sum())
        total += float(losses.sum())
        count += losses.numel()
    if count == 0:
        raise InvalidInputError("longppl: every text is shorter than 2 tokens; nothing to score")
    return {"longppl": math.exp(key_total / keys) if keys else None, "key_tokens": keys,
            "perplexity": math.exp(total / count), "tokens": count, "texts": len(texts)}
