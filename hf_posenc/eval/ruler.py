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

Each family is a class registered with `@register_task` in `TASKS` (docs/ARCHITECTURE.md, "RULER task families"),
which `make_samples`, the evaluate recipe's `eval.tasks` and benchmarks/bench_ruler.py read.

A sample is written as text and tokenized once per probe, context + question + answer together, so what the model
sees is what anyone re-encoding the decoded prompt sees (`prompt == tok(tok.decode(prompt))`). Probes that share a
context run on one prefill (hf_posenc/eval/probes.py) where that is exact. A probe is found when greedy decoding
gives the whole answer (teacher forcing: the argmax at every answer position); its log-probability is kept beside.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from tqdm.auto import tqdm

from ..config import check_number
from ..named import Registry
from ..corpora import bos_prefix
from ..errors import InvalidInputError, InvalidParameterError
from ..causal_lm import check_causal_lm
from . import stats
from .perplexity import check_length
from .probes import score_probes
from .retrieval import FILLER, INTRO, KEYS, Haystack, check_depths, check_haystack, check_lengths, framing

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
        # distinct names, a repeat drawn again alone: redrawing them all on any repeat never ends for long chains
        names, seen = [], set()
        while len(names) < hops + 1:
            name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
            if name not in seen:
                seen.add(name)
                names.append(name)
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


# -- the families, as a registry ----------------------------------------------------------------------------

class TaskFamily:
    """A family of retrieval tasks (docs/ARCHITECTURE.md, "RULER task families"): what one sample hides in its
    haystack and what it asks."""

    name: ClassVar[str]
    ruler: ClassVar[str] = ""                 # the RULER task it follows
    summary: ClassVar[str] = ""               # its context, and what each probe asks
    noise: ClassVar[bool] = False             # its haystack is the noise line, not a real text (no `haystack`)
    reads: ClassVar[tuple[str, ...]] = ()     # which of make_samples' depths, needles, hops change its samples

    def content(self, rng: random.Random, needles: int, hops: int) -> tuple[list[str], list[tuple[str, str]]]:
        """(needle lines, [(question, answer), ...]) of one sample, drawn from `rng` alone: each needle a line
        ending in a newline (one needle sits at the sample's depth, several at random depths, in order), and one
        probe per (question, answer), the answer continuing the question from a space."""
        raise NotImplementedError


TASKS = Registry("task family", TaskFamily, setting="eval.tasks", decorator="register_task")   # name -> family


def register_task(cls: type[TaskFamily]) -> type[TaskFamily]:
    """Class decorator: make `cls` a family `make_samples` and `eval.tasks` take by its `name`. A name already
    taken is refused, naming both classes."""
    return TASKS.register(cls)


class _Written(TaskFamily):
    """RULER's families as `_content` writes them."""

    def content(self, rng, needles, hops):
        texts, asks = _content(self.name, rng, needles, hops)
        return [text for text, _ in texts], asks


@register_task
class Passkey(_Written):
    """RULER's niah_single_1."""
    name, ruler, noise, reads = "passkey", "niah_single_1", True, ("depths",)
    summary = "one 7-digit number in a repeated noise line; asks that number"


@register_task
class Single(_Written):
    """RULER's niah_single_2."""
    name, ruler, reads = "single", "niah_single_2", ("depths",)
    summary = "one number for a key word in real text; asks the number of the key"


@register_task
class Multikey(_Written):
    """RULER's niah_multikey_1."""
    name, ruler, reads = "multikey", "niah_multikey_1", ("needles",)
    summary = "`needles` numbers for as many key words in real text; asks each key's number (a probe a key)"


@register_task
class Multivalue(_Written):
    """RULER's niah_multivalue."""
    name, ruler, reads = "multivalue", "niah_multivalue", ("needles",)
    summary = "`needles` numbers for one key word in real text; asks all of them, in the order they appear"


@register_task
class Multiquery(_Written):
    """RULER's niah_multiquery."""
    name, ruler, reads = "multiquery", "niah_multiquery", ("needles",)
    summary = "`needles` numbers for as many key words in real text; asks all of them, in the order asked"


@register_task
class VariableTracking(_Written):
    """RULER's vt."""
    name, ruler, noise, reads = "vt", "vt", True, ("hops",)
    summary = "a chain VAR A = 12345, VAR B = VAR A, ... (`hops` links) in noise; asks every variable holding the value"


def _checked_content(cls: type[TaskFamily], rng: random.Random, needles: int, hops: int):
    """A registered family's content, refused naming the family when it is not what `TaskFamily.content` says:
    needle lines, each ending in a newline (a needle sits between haystack lines), and probes whose answers are a
    token at least, every word of them in the needle lines, all drawn from `rng` alone (drawn again from the same
    state, the same sample)."""
    state = rng.getstate()
    content = cls().content(rng, needles, hops)
    where = f"task family {cls.name!r} ({cls.__module__}.{cls.__qualname__}).content"
    if not (isinstance(content, (tuple, list)) and len(content) == 2):
        raise InvalidInputError(f"{where} must return (needle lines, [(question, answer), ...]), got {content!r:.60}")
    texts, asks = content
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise InvalidInputError(f"{where} gave no needle to hide (needle lines must be non-empty strings), got "
                                f"{texts!r:.60}")
    if not isinstance(asks, (list, tuple)) or not asks or not all(
            isinstance(a, (tuple, list)) and len(a) == 2 and all(isinstance(x, str) for x in a) and a[1].strip()
            for a in asks):
        raise InvalidInputError(f"{where} gave no probe to ask (a list of (question, answer) strings, each answer "
                                f"non-empty), got {asks!r:.60}")
    for i, text in enumerate(texts):
        if not text.endswith("\n"):
            raise InvalidInputError(f"{where} gave needle line {i} {text!r:.60} without a newline at its end: a needle "
                                    f"is a line of its own between the haystack's lines")
    hidden = "".join(texts)
    for question, answer in asks:
        missing = [word for word in re.split(r"[\s,]+", answer.strip()) if word not in hidden]
        if missing:
            raise InvalidInputError(f"{where} gave the answer {answer!r:.60}, but {' '.join(missing)!r:.40} of it is "
                                    f"in none of its needle lines: a probe asks for what the context holds")
    again = random.Random()
    again.setstate(state)
    if cls().content(again, needles, hops) != content:
        raise InvalidInputError(f"{where} drew another sample from the same state of rng: it must draw from the rng "
                                f"it is given alone (not the random module, uuid4 or the clock), so that the seed "
                                f"gives the sample")
    return list(texts), [tuple(a) for a in asks]


def build_sample(tokenizer, haystack: Haystack, family: str, length: int, *, index: int, seed: int,
                 depths: Sequence[float] = (0.5,), needles: int = 4, hops: int = 4, bos: bool | str = "auto",
                 start: int = 0) -> Sample:
    """One sample of `family` whose longest probe (prompt + answer) is at most `length` tokens, as many whole
    haystack lines as fit. The needles sit at line boundaries: a single needle at depths[index % len(depths)],
    several at random depths (a chain in order)."""
    rng = random.Random(f"{seed}/{family}/{length}/{index}")
    texts, asks = _checked_content(TASKS[family], rng, needles, hops)
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
                    body += texts[n]
            body += line
        context = body + "\n"
        encoded = [tokenizer(context + q + a, add_special_tokens=False, return_offsets_mapping=True)
                   for q, a in asks]
        return len(head) + max(len(e["input_ids"]) for e in encoded), (context, needle_chars, encoded)

    size, built = build(0)
    if size > length:
        chain = f" with hops={hops}" if family == "vt" else ""
        raise InvalidParameterError(f"length {length} is too short for a {family} sample{chain} ({size} tokens "
                                    f"without any haystack)")
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
    if not isinstance(family, str):
        raise InvalidParameterError(f"unknown retrieval family {family!r} (one family a call: make_samples(name, ...) "
                                    f"for each); known: {', '.join(TASKS)}")
    TASKS.get(family)   # an unknown name refused, the known ones listed
    lengths, depths = check_lengths(lengths), check_depths(depths)
    check_number("samples", samples, minimum=1, integer=True, optional=False)
    check_number("needles", needles, minimum=2, maximum=len(KEYS), integer=True, optional=False)
    check_number("hops", hops, minimum=1, integer=True, optional=False)
    if family == "vt" and hops >= min(lengths):   # each link's line takes a token at least: bounded before any work
        raise InvalidParameterError(f"hops={hops} makes a chain of {hops + 1} variable lines, at least one token "
                                    f"each: more than the shortest length {min(lengths)}; hops must be < "
                                    f"{min(lengths)}, and far fewer fit (RULER's: 4)")
    check_number("seed", seed, integer=True, optional=False)
    check_haystack(haystack, not TASKS[family].noise, f"the {family} family")
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidInputError(f"retrieval samples find the answer by the tokenizer's character offsets, which only "
                                f"a fast tokenizer gives; {type(tokenizer).__name__} is not one")
    framing(tokenizer, bos)
    hay = Haystack(tokenizer, FILLER if TASKS[family].noise else haystack)
    rng = random.Random(seed)
    jobs = [(length, i, 0 if TASKS[family].noise else rng.randrange(len(hay.lines)))
            for length in lengths for i in range(samples)]
    # the shortest first: a length too short for the sample is refused before any longer one is built
    built = {}
    for k in sorted(range(len(jobs)), key=lambda k: jobs[k][0]):
        length, i, start = jobs[k]
        built[k] = build_sample(tokenizer, hay, family, length, index=i, seed=seed, depths=depths, needles=needles,
                                hops=hops, bos=bos, start=start)
    return [built[k] for k in range(len(jobs))]


def score_samples(model: torch.nn.Module, samples: Sequence[Sample], *, progress: bool = True) -> list[dict]:
    """One row per probe: family, length, sample, depth, distance, correct, logprob, whether its context
    was a shared prefill and how it ran ("prefill": `probes.score_probes`'s)."""
    check_causal_lm(model, "score_samples")
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence) or not samples \
            or not all(isinstance(s, Sample) for s in samples):
        raise InvalidInputError(f"samples must be a non-empty list of the Samples make_samples gives, got "
                                f"{samples!r:.60}")
    check_length(model, max(len(p.prompt) + len(p.answer) for s in samples for p in s.probes))   # before any pass
    rows = []
    for sample in tqdm(samples, desc="retrieval", unit="sample", disable=not progress):
        out = score_probes(model, [(p.prompt, p.answer) for p in sample.probes])
        rows += [{"family": sample.family, "length": sample.length, "sample": sample.index, "depth": p.depth,
                  "distance": p.distance, "shared": out["shared"], "prefill": out["prefill"], **s} for p, s in zip(sample.probes, out["scores"])]
    return rows


ROW_KEYS = {"family", "length", "correct", "logprob", "shared"}   # what a cell reads of score_samples' rows


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
    stats.check_rows(rows, ROW_KEYS, "summarize_samples", "score_samples")
    for i, row in enumerate(rows):
        if isinstance(row["length"], bool) or not isinstance(row["length"], int) \
                or not isinstance(row["correct"], (bool, int)) or isinstance(row["logprob"], bool) \
                or not isinstance(row["logprob"], (int, float)):
            raise InvalidInputError(f"rows[{i}] is not a row of score_samples: length an int, correct a bool and "
                                    f"logprob a number, got {row['length']!r:.20}, {row['correct']!r:.20}, "
                                    f"{row['logprob']!r:.20}")
    check_number("threshold", threshold, minimum=0, maximum=1, optional=False)   # an accuracy: a share of probes
    if (native is None) != (share_of_native is None):
        raise InvalidParameterError(f"native and share_of_native go together (the bar: that share of the accuracy "
                                    f"at the native length), got native={native!r}, share_of_native="
                                    f"{share_of_native!r}")
    if native is not None:
        check_number("native", native, minimum=2, integer=True, optional=False)
        check_number("share_of_native", share_of_native, above=0, maximum=1, optional=False)
        for family in sorted({r["family"] for r in rows}):
            measured = sorted({r["length"] for r in rows if r["family"] == family})
            if native not in measured:
                raise InvalidParameterError(f"native={native} is not a length measured for {family} "
                                            f"({', '.join(map(str, measured))}): the bar is a share of the accuracy "
                                            f"there")
    out = {}
    for family in sorted({r["family"] for r in rows}):
        cells = {}
        for length in sorted({r["length"] for r in rows if r["family"] == family}):
            mine = [r for r in rows if r["family"] == family and r["length"] == length]
            cells[length] = {**stats.wilson(sum(r["correct"] for r in mine), len(mine)),
                             "logprob": stats.bootstrap_mean([r["logprob"] for r in mine]),
                             "shared": all(r["shared"] for r in mine), "prefill": _prefill(mine)}
        bar = threshold if native is None else share_of_native * cells[native]["accuracy"]
        out[family] = {"cells": cells, "threshold": bar,
                       "effective_length": stats.effective_length({n: c["accuracy"] for n, c in cells.items()}, bar)}
    return out
