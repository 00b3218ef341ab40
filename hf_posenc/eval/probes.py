"""Many probes on one long context: the context runs once into a KV cache, each probe (question + answer) runs
on that cache, and the cache is put back as it was before the next probe. A probe then costs its own few tokens
instead of a whole long pass.

Exact where a cached continuation is the full forward: every position-encoding method whose positions do not
follow the length of the whole input (tested for every registered method, tests/test_probes.py). A method
whose frequencies follow the input length (dynamic NTK, dynamic YaRN, LongRoPE's switch) rotates the cached
keys for the context's length, not the probe's: those get a full forward per probe, and the result says so
("shared": False, "prefill": "fell back"); `share=True` on such a model is refused."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from .. import _compat
from ..config import check_bool
from ..errors import InvalidInputError, InvalidParameterError
from ..causal_lm import check_causal_lm, check_token_ids, decoder
from .perplexity import check_length, is_length_dependent, token_list


def _listed(value, name: str, what: str) -> None:
    """Refuse what is not a non-empty list (a str, None, a number, an empty list) naming `name`."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise InvalidInputError(f"{name} must be a non-empty list of {what}, got {value!r:.60}")


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """The number of leading tokens every sequence shares."""
    _listed(sequences, "common_prefix's sequences", "token id sequences")
    for i, s in enumerate(sequences):
        if isinstance(s, (str, bytes)) or not isinstance(s, (Sequence, torch.Tensor)):
            raise InvalidInputError(f"sequences[{i}] must be token ids (a list of ints), got {s!r:.60}")
    first, n = sequences[0], min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != first[i] for s in sequences):
            return i
    return n


def can_share(model: torch.nn.Module) -> bool:
    """Whether a probe on a restored cache equals a full forward for this model (see the module's text)."""
    return not is_length_dependent(model)


def _snapshot(cache) -> list[dict]:
    # A layer's update builds new tensors (a DynamicCache concatenates), so keeping references restores it;
    # a static cache writes past the context, where the next probe's positions overwrite it.
    return [dict(layer.__dict__) for layer in cache.layers]


def _restore(cache, snapshot: list[dict]) -> None:
    for layer, state in zip(cache.layers, snapshot):
        layer.__dict__.clear()
        layer.__dict__.update(state)


def _keeps_logits(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _logits(model, ids: torch.Tensor, keep: int, **kw) -> torch.Tensor:
    if _keeps_logits(model):
        return model(ids, logits_to_keep=keep, **kw).logits
    return model(ids, **kw).logits[:, -keep:]


def _prefill(model, context: torch.Tensor, cache) -> None:
    """Run the shared context into `cache` without the output layer over it: nothing of the prefill is scored,
    and its logits ([1, n, vocab] floats: 34 GB at 32k tokens of a 262k vocabulary) would dwarf the cache."""
    if _keeps_logits(model):
        model(context, use_cache=True, logits_to_keep=1, **{_compat.cache_argument(model): cache})
        return
    body = decoder(model)   # the decoder under the head, where the forward cannot skip it
    body(context, use_cache=True, **{_compat.cache_argument(body): cache})


def _score(logits: torch.Tensor, answer: torch.Tensor) -> dict:
    logits = logits.float()
    return {"correct": bool((logits.argmax(-1) == answer).all()),
            "logprob": logits.log_softmax(-1).gather(-1, answer[:, None]).sum().item()}


@torch.inference_mode()
def score_probes(model: torch.nn.Module, probes: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                 share: bool | None = None) -> dict:
    """Score each probe (prompt ids, answer ids) by teacher forcing: "correct" when greedy decoding gives the
    answer (the argmax at every answer position), "logprob" of the whole answer. The prompts' common prefix
    runs once and is shared (`share=None`: where that is exact, `can_share`). Returns {"scores": [...],
    "shared": bool, "prefill": how the probes ran, "prefix": tokens shared, "tokens": tokens run in all}.
    "prefill" is "shared", "one probe" (nothing to share), "fell back" (`share=None` on a model whose
    positions follow the input length: a full pass per probe) or "not shared" (`share=False`, or prompts
    with no common prefix)."""
    check_causal_lm(model, "score_probes")
    if share is not None:
        check_bool("share", share)
    if not isinstance(probes, Sequence) or isinstance(probes, (str, bytes)) or not probes:
        raise InvalidInputError(f"score_probes needs at least one (prompt, answer) probe, got {probes!r:.60}")
    checked = []
    for i, probe in enumerate(probes):
        if isinstance(probe, (str, bytes)) or not isinstance(probe, Sequence) or len(probe) != 2:
            raise InvalidInputError(f"probes[{i}] must be a (prompt ids, answer ids) pair, got {probe!r:.60}")
        prompt, answer = token_list(probe[0], f"probes[{i}] prompt"), token_list(probe[1], f"probes[{i}] answer")
        if not prompt or not answer:
            raise InvalidInputError(f"probe {i} has an empty prompt or answer ({len(prompt)}, {len(answer)} tokens)")
        check_token_ids(model, torch.tensor(prompt + answer), f"probes[{i}]")
        checked.append((prompt, answer))
    probes = checked
    if share and not can_share(model):   # asked for: refused rather than scored inexactly
        raise InvalidParameterError(
            "share=True runs the probes on one cached context, but this model's positions follow the input length "
            "(dynamic scaling, LongRoPE's switch): a probe on that cache is not what its own full pass computes; "
            "use share=None (a full pass per probe here) or share=False")
    check_length(model, max(len(p) + len(a) for p, a in probes))     # a learned table's end, before any pass
    device = next(model.parameters()).device
    full = [p + a for p, a in probes]
    fell_back = share is None and not can_share(model)
    share = can_share(model) if share is None else share
    # the shared prefix leaves at least one prompt token to every probe: its logit predicts the first answer token
    prefix = min(common_prefix([list(p) for p, _ in probes]), *(len(p) - 1 for p, _ in probes)) if share else 0
    scores, ran = [], 0
    if prefix < 1 or len(probes) == 1:
        for ids, (_, answer) in zip(full, probes):
            logits = _logits(model, torch.tensor([ids], device=device), len(answer) + 1, use_cache=False)
            scores.append(_score(logits[0, :-1], torch.tensor(answer, device=device)))
            ran += len(ids)
        prefill = "one probe" if len(probes) == 1 else "fell back" if fell_back else "not shared"
        return {"scores": scores, "shared": False, "prefill": prefill, "prefix": 0, "tokens": ran}
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    _prefill(model, torch.tensor([full[0][:prefix]], device=device), cache)
    by = {_compat.cache_argument(model): cache}
    ran += prefix
    kept = _snapshot(cache)
    for ids, (_, answer) in zip(full, probes):
        rest = torch.tensor([ids[prefix:]], device=device)
        positions = torch.arange(prefix, len(ids), device=device)[None]
        logits = _logits(model, rest, len(answer) + 1, use_cache=True, position_ids=positions, **by)
        scores.append(_score(logits[0, :-1], torch.tensor(answer, device=device)))
        _restore(cache, kept)
        ran += rest.shape[1]
    return {"scores": scores, "shared": True, "prefill": "shared", "prefix": prefix, "tokens": ran}
