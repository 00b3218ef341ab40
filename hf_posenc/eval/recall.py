"""Recall at a distance: how much a model uses context that far back, many probes per long pass.

Passages of a held-out text sit in one sequence and repeat later in it; the rest of the sequence is more of
the same text (filler). A second sequence, the control, is the same token for token except that each first
copy is replaced by another passage of the text, never used elsewhere. For passage i the gap is

    gap_i = loss of the repeat in the control - loss of the repeat with its first copy  (nats per token)

a model that reads the first copy back predicts the repeat almost for free (gap ~ 2 nats for a small model);
one that cannot reach that far gains nothing (gap ~ 0). The control pass makes the measure safe where a model
breaks down: past the context it was trained for, every token's loss rises, and the control sees that rise at
the same positions. The one-pass form (`control=False`) takes the first copy's own loss as the baseline
instead: half the cost, agrees with the control where the model holds up, and is wrong where it does not
(the report says which form a cell used). The first token of each passage is left out of both losses: nothing
before it says which passage starts.

    layout = plan_layout(32768, passages=48)                        # positions only: checked before any loading
    sets = make_recall(tokenizer, text, layout, seed=0)             # the token sequences
    scores = score_recall(model, sets)                              # one gap per passage
    summary = summarize_recall(scores, bin_width=4096)              # gap, by distance, recall distance

Placement: by default the first copies sit evenly in the first half of the sequence and the repeats evenly in
the second half, in a shuffled order, so the distances spread from ~0 to the whole length; `distances=` asks
for chosen distances instead (each passage takes the next one, round robin)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..config import check_bool, check_number
from ..errors import InvalidInputError, InvalidParameterError, ParameterTypeError
from ..causal_lm import check_causal_lm
from . import stats
from .perplexity import check_length, token_list, token_nll
from .retrieval import MAX_LENGTH


@dataclass(frozen=True)
class Layout:
    """Where each passage's first copy and repeat start, in a sequence of `length` tokens whose first `head`
    tokens are the framing (BOS)."""

    length: int
    passage_tokens: int
    head: int
    firsts: tuple[int, ...]
    repeats: tuple[int, ...]

    @property
    def distances(self) -> list[int]:
        return [r - f for f, r in zip(self.firsts, self.repeats)]

    @property
    def text_tokens(self) -> int:
        """Distinct tokens of the text one sequence takes (`make_recall`): its filler, its passages and the
        control's other passages, all the sequence but its head."""
        return self.length - self.head


@dataclass
class RecallSet:
    """One sequence with the first copies and its control, and the layout they share."""

    layout: Layout
    with_copy: list[int]
    control: list[int]
    index: int = 0                      # which sequence of the cell
    passages: list[int] = field(default_factory=list)   # where each passage starts in the text's tokens


DENSITY = 16 / 9   # tokens of a sequence's half per passage token: 24 passages of 192 in each half of 16k


def cell_sequences(length: int, passages: int, passage_tokens: int = 192) -> tuple[int, int]:
    """(passages a sequence, sequences) of a recall cell of `passages` at `length`: at most DENSITY's share of
    each half in passages, over as many sequences as that needs."""
    check_number("length", length, minimum=2, maximum=MAX_LENGTH, integer=True, optional=False)
    check_number("passages", passages, minimum=1, integer=True, optional=False)
    check_number("passage_tokens", passage_tokens, minimum=1, integer=True, optional=False)
    most = max(1, int((length // 2) / (passage_tokens * DENSITY)))
    per_sequence = min(passages, most)
    return per_sequence, -(-passages // per_sequence)


def plan_layout(length: int, *, passages: int, passage_tokens: int = 192, distances: Sequence[int] | None = None,
                head: int = 0, seed: int = 0) -> Layout:
    """The positions of `passages` first copies and their repeats in `length` tokens (`head` framing tokens
    first). Refused, naming what does not fit, when the passages do not fit in the length or a distance is not
    shorter than it: numbers only, so a recipe checks it before loading anything."""
    check_number("length", length, minimum=2, maximum=MAX_LENGTH, integer=True, optional=False)
    check_number("passages", passages, minimum=1, integer=True, optional=False)
    check_number("passage_tokens", passage_tokens, minimum=8, integer=True, optional=False)
    check_number("head", head, minimum=0, integer=True, optional=False)
    room = length - head
    if 2 * passages * passage_tokens > room:
        raise InvalidParameterError(
            f"{passages} passages of {passage_tokens} tokens, each twice (first copy and repeat), need "
            f"{2 * passages * passage_tokens} tokens; a sequence of {length} holds {room} after its {head} framing "
            f"token(s): use fewer or shorter passages, or a longer length")
    if distances is None:
        return _halves(length, passages, passage_tokens, head, seed)
    if isinstance(distances, (str, bytes)) or not isinstance(distances, Sequence):
        raise ParameterTypeError(f"distances must be a list of ints (token distances) or None, got {distances!r:.60} "
                                 f"({type(distances).__name__})")
    distances = list(distances)
    if not distances:
        raise InvalidParameterError("distances is empty: give at least one distance, or none for the default spread")
    for i, d in enumerate(distances):
        check_number(f"distances[{i}]", d, minimum=passage_tokens, integer=True, optional=False)
        if d > room - passage_tokens:
            raise InvalidParameterError(
                f"distance {d} does not fit in a sequence of {length}: a first copy and its repeat {d} tokens later "
                f"need {d + passage_tokens} tokens after the {head} framing token(s); the longest distance is "
                f"{room - passage_tokens}")
    return _at_distances(length, passages, passage_tokens, head, [distances[i % len(distances)]
                                                                  for i in range(passages)], seed)


def _halves(length: int, passages: int, size: int, head: int, seed: int) -> Layout:
    half = (length - head) // 2
    pitch = half // passages
    starts = [head + i * pitch + (pitch - size) // 2 for i in range(passages)]
    order = list(range(passages))
    random.Random(seed).shuffle(order)
    repeats = [head + half + j * pitch + (pitch - size) // 2 for j in range(passages)]
    return Layout(length, size, head, tuple(starts), tuple(repeats[order.index(i)] for i in range(passages)))


def _at_distances(length: int, passages: int, size: int, head: int, wanted: list[int], seed: int) -> Layout:
    """Slots of `pitch` tokens; passage i takes two free slots k_i apart (k_i pitch ~ its distance), the
    longest distances placed first, each at a random free pair."""
    room = length - head
    rng = random.Random(seed)
    for pitch in sorted({max(size, room // n) for n in range(2 * passages, room // size + 1)}, reverse=True):
        slots = room // pitch
        steps = [max(1, min(slots - 1, round(d / pitch))) for d in wanted]
        free, firsts, repeats = [True] * slots, [0] * passages, [0] * passages
        for i in sorted(range(passages), key=lambda i: -steps[i]):
            k = steps[i]
            pairs = [s for s in range(slots - k) if free[s] and free[s + k]]
            if not pairs:
                break
            s = rng.choice(pairs)
            free[s] = free[s + k] = False
            offset = (pitch - size) // 2
            firsts[i], repeats[i] = head + s * pitch + offset, head + (s + k) * pitch + offset
        else:
            return Layout(length, size, head, tuple(firsts), tuple(repeats))
    raise InvalidParameterError(
        f"cannot place {passages} passages of {size} tokens at distances {sorted(set(wanted))} in {length} tokens "
        f"without overlap: use fewer passages or shorter distances")


def _text_tokens(tokenizer, text: str | Sequence[int]) -> list[int]:
    if isinstance(text, str):
        if not callable(tokenizer):
            raise InvalidInputError(f"tokenizer must be a transformers tokenizer to read a text, got "
                                    f"{tokenizer!r:.60}")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif text is None or isinstance(text, (int, float, bytes)) or not hasattr(text, "__len__"):
        raise InvalidInputError(f"the recall text must be a str or its token ids (a list of ints), got {text!r:.60} "
                                f"({type(text).__name__})")
    else:
        ids = token_list(text, "the recall text's token ids")
    if not ids:
        raise InvalidInputError("the recall text is empty")
    return ids


def make_recall(tokenizer, text: str | Sequence[int], layout: Layout, *, sequences: int = 1, seed: int = 0,
                prefix: Sequence[int] = ()) -> list[RecallSet]:
    """`sequences` pairs (with the first copies, control) on `layout`, from `text` (a string, or its token
    ids). Each sequence reads its filler as one stretch of the text and takes its passages and the control's
    other passages from elsewhere in it, all apart: no passage occurs twice but by design. `prefix` (BOS)
    fills the layout's head."""
    check_number("sequences", sequences, minimum=1, integer=True, optional=False)
    check_number("seed", seed, integer=True, optional=False)
    if not isinstance(layout, Layout):
        raise ParameterTypeError(f"layout must be a Layout (plan_layout gives one), got {layout!r:.60}")
    prefix = token_list(prefix, "prefix")
    if len(prefix) != layout.head:
        raise InvalidParameterError(f"prefix has {len(prefix)} token(s), the layout's head {layout.head}")
    ids = _text_tokens(tokenizer, text)
    n, size = len(layout.firsts), layout.passage_tokens
    filler_tokens = layout.text_tokens - 2 * n * size
    need = sequences * layout.text_tokens
    if len(ids) < need:
        raise InvalidInputError(
            f"the recall text has {len(ids)} tokens; {sequences} sequence(s) of {layout.length} with {n} passages "
            f"of {size} need {need} distinct tokens of it: use a longer text (a corpus of several documents) or "
            f"fewer sequences / passages")
    rng = random.Random(seed)
    # Cut the text into pieces: per sequence one filler stretch and 2n passage-sized pieces, in a random order
    # of pieces so that passages come from all over the text.
    pieces = [("filler", s) for s in range(sequences)] + [("passage", k) for k in range(2 * n * sequences)]
    rng.shuffle(pieces)
    spare = len(ids) - need
    cuts, at = {}, 0
    for kind, k in pieces:
        at += rng.randint(0, spare // (len(pieces) + 1))     # some text between pieces, never reused
        width = filler_tokens if kind == "filler" else size
        cuts[kind, k] = at
        at += width
    out = []
    for s in range(sequences):
        filler = ids[cuts["filler", s]:cuts["filler", s] + filler_tokens]
        mine = [cuts["passage", s * 2 * n + j] for j in range(2 * n)]
        firsts, others = mine[:n], mine[n:]
        marks = sorted([(f, "first", i) for i, f in enumerate(layout.firsts)]
                       + [(r, "repeat", i) for i, r in enumerate(layout.repeats)])
        with_copy, control, used = list(prefix), list(prefix), 0
        for position, kind, i in marks:
            gap = position - len(with_copy)
            with_copy += filler[used:used + gap]
            control += filler[used:used + gap]
            used += gap
            with_copy += ids[firsts[i]:firsts[i] + size]
            control += ids[(others[i] if kind == "first" else firsts[i]):][:size]
        tail = layout.length - len(with_copy)
        with_copy += filler[used:used + tail]
        control += filler[used:used + tail]
        assert len(with_copy) == len(control) == layout.length, (len(with_copy), len(control))
        out.append(RecallSet(layout, with_copy, control, index=s, passages=firsts))
    return out


def _span_loss(nll: torch.Tensor, start: int, size: int) -> float:
    """Mean loss of tokens start + 1 .. start + size - 1 (entry t of token_nll scores token t + 1)."""
    return nll[start:start + size - 1].mean().item()


@torch.inference_mode()
def score_recall(model: torch.nn.Module, sets: Sequence[RecallSet], *, control: bool = True,
                 progress: bool = True, chunk_size: int = 1024) -> list[dict]:
    """One row per passage: its distance, where it sits, the repeat's loss with its first copy, the baseline
    (the repeat's loss in the control pass, or with `control=False` the first copy's own loss) and the gap
    (baseline - with). Two passes a set (one with `control=False`)."""
    check_causal_lm(model, "score_recall")
    check_bool("control", control)      # a str is truthy: control='no' ran the control form
    check_bool("progress", progress)
    if isinstance(sets, (str, bytes)) or not isinstance(sets, Sequence) or not sets:
        raise InvalidInputError(f"score_recall needs at least one recall set (make_recall), got {sets!r:.60}")
    for i, s in enumerate(sets):
        if not isinstance(s, RecallSet):
            raise InvalidInputError(f"sets[{i}] must be a RecallSet (make_recall gives them), got {s!r:.60}")
    check_length(model, max(s.layout.length for s in sets))    # a learned table's end, before the first pass
    rows = []
    passes = len(sets) * (2 if control else 1)
    bar = tqdm(total=passes, desc="recall", unit="pass", disable=not progress)
    for s in sets:
        device = next(model.parameters()).device
        with_nll = token_nll(model, torch.tensor([s.with_copy], device=device), chunk_size=chunk_size)[0].cpu()
        bar.update()
        base_nll = None
        if control:
            base_nll = token_nll(model, torch.tensor([s.control], device=device), chunk_size=chunk_size)[0].cpu()
            bar.update()
        size = s.layout.passage_tokens
        for i, (first, repeat) in enumerate(zip(s.layout.firsts, s.layout.repeats)):
            loss_with = _span_loss(with_nll, repeat, size)
            baseline = _span_loss(base_nll, repeat, size) if control else _span_loss(with_nll, first, size)
            rows.append({"sequence": s.index, "passage": i, "first_at": first, "repeat_at": repeat,
                         "distance": repeat - first, "loss_with": loss_with, "baseline": baseline,
                         "gap": baseline - loss_with, "form": "control" if control else "one-pass"})
    bar.close()
    return rows


def distance_bins(length: int, width: int | None = None) -> list[int]:
    """Bin edges 0, w, 2w, ... up to `length`: by default w = length / 8 rounded to a power of two (>= 256)."""
    check_number("length", length, minimum=1, integer=True, optional=False)
    if width is None:
        width = max(256, 2 ** round(math.log2(max(1, length / 8))))
    check_number("bin_width", width, minimum=1, integer=True, optional=False)
    return list(range(0, length, width)) + [length]


ROW_KEYS = {"form", "repeat_at", "distance", "gap", "sequence", "passage"}   # what summarize_recall reads of a row


def summarize_recall(rows: Sequence[dict], *, length: int | None = None, bin_width: int | None = None,
                     seed: int = 0) -> dict:
    """The cell's gap (mean and 95 % bootstrap interval, n), the gap by distance bin, and the recall distance:
    the upper edge of the last bin, counted from the shortest distances, whose mean gap stays above half the
    first bin's (None when the first bin is empty or its gap is not positive; `beyond_measured` when no bin
    falls below, so the model recalls at least that far)."""
    stats.check_rows(rows, ROW_KEYS, "summarize_recall", "score_recall")
    longest = max(r["distance"] for r in rows)
    if length is not None:
        check_number("length", length, minimum=1, integer=True, optional=False)
        if length <= longest:   # the bins end at the length: the passages past it would go unreported
            raise InvalidParameterError(f"length={length} is not longer than the rows' longest distance {longest}: "
                                        f"the bins cover distances below the length (give the sequences' length)")
    forms = sorted({r["form"] for r in rows})
    length = length or max(r["repeat_at"] for r in rows)
    edges = distance_bins(length, bin_width)
    gaps = [r["gap"] for r in rows]
    bins = []
    for low, high in zip(edges, edges[1:]):
        inside = [r["gap"] for r in rows if low <= r["distance"] < high]
        if inside:
            bins.append({"start": low, "end": high, **stats.bootstrap_mean(inside, seed=seed)})
    recall, beyond = None, False
    if bins and bins[0]["mean"] > 0:
        half = bins[0]["mean"] / 2
        recall, beyond = bins[0]["end"], True
        for b in bins[1:]:
            if b["mean"] < half:
                beyond = False
                break
            recall = b["end"]
        if beyond:
            recall = max(r["distance"] for r in rows)
    return {"form": "+".join(forms), "gap": stats.bootstrap_mean(gaps, seed=seed), "bins": bins,
            "recall_distance": recall, "beyond_measured": beyond,
            "passages": [{k: r[k] for k in ("sequence", "passage", "distance", "gap")} for r in rows]}
