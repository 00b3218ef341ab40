"""Retrieval tasks of RULER's families (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?"), generated offline from a seed:

| family | RULER's task | the context | each probe asks |
|---|---|---|---|
| passkey | niah_single_1 | one 7-digit number in a repeated noise line | that number |
| single | niah_single_2 | one number for a key word in real text | the number of the key |
| multikey | niah_multikey_1 | `needles` numbers for as many key words in real text | the number of one key (one probe per key, one shared context) |
| multivalue | niah_multivalue | `needles` numbers for one key word | all of them, in the order they appear |
| multiquery | niah_multiquery | `needles` numbers for as many keys | all of them, in the order asked |
| vt | vt | a chain `VAR A = 12345`, `VAR B = VAR A`, ... (`hops` links) in noise | every variable that holds the value |

A sample is written as text and tokenized once per probe, context + question + answer together, so what the model
sees is what anyone re-encoding the decoded prompt sees (`prompt == tok(tok.decode(prompt))`). Probes that share a
context run on one prefill (hf_posenc/eval/probes.py) where that is exact. A probe is found when greedy decoding
gives the whole answer (teacher forcing: the argmax at every answer position); its log-probability is kept beside.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..config import check_number
from ..data import bos_prefix
from ..errors import InvalidInputError, InvalidParameterError
from . import stats
from .probes import score_probes
from .retrieval import FILLER, INTRO, KEYS, Haystack

FAMILIES = ("passkey", "single", "multikey", "multivalue", "multiquery", "vt")
NOISE = ("passkey", "vt")          # their haystack is the noise line; the others' real text
RULER_THRESHOLD = 0.856            # RULER's bar for the effective length: Llama-2-7B's score at 4k


@dataclass
class Probe:
    prompt: list[int]
    answer: list[int]
    depth: float                    # where its (first) needle sits, as a share of the haystack
    distance: int                   # tokens from its (first) needle to the end of the prompt


@dataclass
class Sample:
    family: str
    length: int
    index: int
    probes: list[Probe] = field(default_factory=list)


def _number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}.\n"


def _content(family: str, rng: random.Random, needles: int, hops: int):
    """(needle texts with their share of the haystack, [(question, answer), ...]) of one sample."""
    if family in ("passkey", "single"):
        key = "the pass key" if family == "passkey" else rng.choice(KEYS)
        value = _number(rng)
        return [(_needle(key, value), None)], [(
            f"What is the special magic number for {key} mentioned in the provided text? "
            f"The special magic number for {key} mentioned in the provided text is", f" {value}")]
    if family == "vt":
        names = ["".join(rng.choice(string.ascii_uppercase) for _ in range(5)) for _ in range(hops + 1)]
        while len(set(names)) < len(names):
            names = ["".join(rng.choice(string.ascii_uppercase) for _ in range(5)) for _ in range(hops + 1)]
        value = str(rng.randint(10000, 99999))
        chain = [f"VAR {names[0]} = {value}.\n"] + [f"VAR {b} = VAR {a}.\n" for a, b in zip(names, names[1:])]
        return [(text, None) for text in chain], [(
            f"Find all variables that are assigned the value {value} in the text above. According to the chain "
            f"of variable assignment in the text above, {len(names)} variables are assigned the value {value}, "
            f"they are:", " " + " ".join(names))]
    keys = rng.sample(KEYS, needles) if family != "multivalue" else [rng.choice(KEYS)] * needles
    values = [_number(rng) for _ in range(needles)]
    texts = [(_needle(k, v), None) for k, v in zip(keys, values)]
    if family == "multikey":
        return texts, [(f"What is the special magic number for {k} mentioned in the provided text? The special "
                        f"magic number for {k} mentioned in the provided text is", f" {v}") for k, v in zip(keys, values)]
    if family == "multivalue":
        return texts, [(f"What are all the special magic numbers for {keys[0]} mentioned in the provided text? The "
                        f"special magic numbers for {keys[0]} mentioned in the provided text are",
                        " " + ", ".join(values))]
    order = list(range(needles))
    rng.shuffle(order)
    asked = ", ".join(keys[i] for i in order[:-1]) + f" and {keys[order[-1]]}"
    return texts, [(f"What are all the special magic numbers for {asked} mentioned in the provided text? The "
                    f"special magic numbers for {asked} mentioned in the provided text are",
                    " " + ", ".join(values[i] for i in order))]


def build_sample(tokenizer, haystack: Haystack, family: str, length: int, *, index: int, seed: int,
                 depths: Sequence[float] = (0.5,), needles: int = 4, hops: int = 4, bos: bool | str = "auto",
                 start: int = 0) -> Sample:
    """One sample of `family` whose longest probe (prompt + answer) is at most `length` tokens, as many whole
    haystack lines as fit. The needles sit at line boundaries: a single needle at depths[index % len(depths)],
    several at random depths (a chain in order)."""
    rng = random.Random(f"{seed}/{family}/{length}/{index}")
    texts, asks = _content(family, rng, needles, hops)
    if len(texts) == 1:
        shares = [depths[index % len(depths)]]
    else:
        shares = sorted(rng.random() for _ in texts)
    head = bos_prefix(tokenizer, bos)

    def build(count: int):
        lines = haystack.text(start, count)
        cuts = [round(s * count) for s in shares]
        body, needle_chars = INTRO, []
        for i, line in enumerate(lines + [""]):
            for n, cut in enumerate(cuts):
                if cut == i:
                    needle_chars.append((n, len(body)))
                    body += texts[n][0]
            body += line
        context = body + "\n"
        encoded = [tokenizer(context + q + a, add_special_tokens=False, return_offsets_mapping=True)
                   for q, a in asks]
        return len(head) + max(len(e["input_ids"]) for e in encoded), (context, needle_chars, encoded)

    size, built = build(0)
    if size > length:
        raise InvalidParameterError(f"length {length} is too short for a {family} sample ({size} tokens without "
                                    f"any haystack)")
    low, high = 0, max(1, len(haystack.take(length - size, start)) * 2)
    while build(high)[0] <= length and high < 10 * len(haystack.lines) + 10 * length:
        low, high = high, high * 2
    while high - low > 1:                       # the most lines that fit
        mid = (low + high) // 2
        low, high = (mid, high) if build(mid)[0] <= length else (low, mid)
    size, (context, needle_chars, encoded) = build(low)
    sample = Sample(family, length, index)
    first_needle = min(c for _, c in needle_chars)
    for (question, answer), enc in zip(asks, encoded):
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        end = len(context) + len(question)
        split = next(i for i, (_, stop) in enumerate(offsets) if stop > end)
        at = next(i for i, (_, stop) in enumerate(offsets) if stop > first_needle)
        sample.probes.append(Probe(prompt=head + ids[:split], answer=ids[split:],
                                   depth=shares[0] if len(shares) == 1 else min(shares), distance=split - at))
    return sample


def make_samples(family: str, tokenizer, *, lengths: Sequence[int], samples: int = 8,
                 depths: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9), needles: int = 4, hops: int = 4,
                 haystack: str | None = None, seed: int = 0, bos: bool | str = "auto") -> list[Sample]:
    """`samples` samples of `family` at each length (the same seed gives the same samples). `haystack`: the real
    text of the families that hide needles in it (every family but passkey and vt)."""
    if family not in FAMILIES:
        raise InvalidParameterError(f"unknown retrieval family {family!r}; known: {', '.join(FAMILIES)}")
    lengths, depths = list(lengths), list(depths)
    if not lengths:
        raise InvalidParameterError("make_samples needs at least one length")
    for i, length in enumerate(lengths):
        check_number(f"lengths[{i}]", length, minimum=2, integer=True, optional=False)
    if not depths:
        raise InvalidParameterError("make_samples needs at least one depth")
    for i, depth in enumerate(depths):
        check_number(f"depths[{i}]", depth, minimum=0, maximum=1, optional=False)
    check_number("samples", samples, minimum=1, integer=True, optional=False)
    check_number("needles", needles, minimum=2, maximum=len(KEYS), integer=True, optional=False)
    check_number("hops", hops, minimum=1, integer=True, optional=False)
    if family not in NOISE and not haystack:
        raise InvalidInputError(f"the {family} family hides its needles in real text: give a haystack text")
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidInputError(f"retrieval samples find the answer by the tokenizer's character offsets, which only "
                                f"a fast tokenizer gives; {type(tokenizer).__name__} is not one")
    hay = Haystack(tokenizer, FILLER if family in NOISE else haystack)
    rng = random.Random(seed)
    return [build_sample(tokenizer, hay, family, length, index=i, seed=seed, depths=depths, needles=needles,
                         hops=hops, bos=bos, start=0 if family in NOISE else rng.randrange(len(hay.lines)))
            for length in lengths for i in range(samples)]


def score_samples(model: torch.nn.Module, samples: Sequence[Sample], *, progress: bool = True) -> list[dict]:
    """One row per probe: family, length, sample, depth, distance, correct, logprob, whether its context
    was a shared prefill and how it ran ("prefill": `probes.score_probes`'s)."""
    rows = []
    for sample in tqdm(samples, desc="retrieval", unit="sample", disable=not progress):
        out = score_probes(model, [(p.prompt, p.answer) for p in sample.probes])
        rows += [{"family": sample.family, "length": sample.length, "sample": sample.index, "depth": p.depth,
                  "distance": p.distance, "shared": out["shared"], "prefill": out["prefill"], **s} for p, s in zip(sample.probes, out["scores"])]
    return rows


def _prefill(rows: Sequence[dict]) -> str:
    """How a cell's probes ran (`probes.score_probes`'s "prefill"; rows of an older run say only "shared")."""
    said = sorted({r.get("prefill") or ("shared" if r["shared"] else "not shared") for r in rows})
    return " / ".join(said)


def summarize_samples(rows: Sequence[dict], *, threshold: float = RULER_THRESHOLD,
                      native: int | None = None, share_of_native: float | None = None) -> dict:
    """Per family and length: n, accuracy with its Wilson interval, the mean answer log-prob with its bootstrap
    interval, and how the probes ran. Per family the effective length: the longest length up to which accuracy
    stays above `threshold` (RULER's 0.856) or, with `native` and `share_of_native`, above that share of the
    model's own score at its native length (a small model never reaches RULER's bar)."""
    out = {}
    for family in sorted({r["family"] for r in rows}):
        cells = {}
        for length in sorted({r["length"] for r in rows if r["family"] == family}):
            mine = [r for r in rows if r["family"] == family and r["length"] == length]
            cells[length] = {**stats.wilson(sum(r["correct"] for r in mine), len(mine)),
                             "logprob": stats.bootstrap_mean([r["logprob"] for r in mine]),
                             "shared": all(r["shared"] for r in mine), "prefill": _prefill(mine)}
        bar = threshold
        if native is not None and share_of_native is not None and native in cells:
            bar = share_of_native * cells[native]["accuracy"]
        out[family] = {"cells": cells, "threshold": bar,
                       "effective_length": stats.effective_length({n: c["accuracy"] for n, c in cells.items()}, bar)}
    return out
