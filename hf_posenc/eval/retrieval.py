"""Retrieval at long context: a fact hidden at a depth in a haystack of a given length, then a question.

- passkey (Mohtashami & Jaggi 2023): a 5-digit pass key in a haystack of one repeated filler line.
- needle (RULER's single needle): a 7-digit "special magic number" for a named key, in real text
  (any corpus, e.g. Shakespeare).

A trial is right when greedy decoding would produce the answer: one forward pass over prompt +
answer (teacher forcing), and the argmax at every answer position is the answer token. The answer's
log-probability is kept as well, a softer score."""

from __future__ import annotations

import inspect
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ..config import check_number
from ..corpora import bos_prefix
from ..errors import InvalidInputError, InvalidParameterError, ParameterTypeError, PosEncError
from ..causal_lm import check_causal_lm, check_token_ids
from .perplexity import check_length

KINDS = ("passkey", "needle")   # the classic trials; RULER's families are ruler.TASKS
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
         "memorize it. I will quiz you about it.\n\n")
KEYS = ("apple", "river", "candle", "falcon", "garden", "harbor", "lantern", "meadow", "orchid", "pepper",
        "quartz", "saddle", "thunder", "violet", "walnut", "zephyr")


# The longest prompt the generators build: 1M tokens, past the longest context this project evaluates. The text
# of a longer one takes gigabytes before any model runs (a typo such as 10**7): refused before any work.
MAX_LENGTH = 2**20


def _listed(values, name: str, items: str, item: str) -> list:
    """`values` as a non-empty list (a str or a bare number is refused, naming what the list holds)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ParameterTypeError(f"{name} must be a list of {items}, got {values!r:.60} ({type(values).__name__})")
    if not values:
        raise InvalidParameterError(f"{name} is empty: give at least one {item}")
    return list(values)


def check_lengths(lengths, name: str = "lengths") -> list[int]:
    """`lengths` as a list of prompt lengths: a non-empty list of ints in 2..MAX_LENGTH, refused naming the
    entry (an int where a list is expected, a str, 10**7 tokens)."""
    lengths = _listed(lengths, name, "ints (token counts)", "length")
    for i, length in enumerate(lengths):
        check_number(f"{name}[{i}]", length, minimum=2, integer=True, optional=False)
        if length > MAX_LENGTH:
            raise InvalidParameterError(f"{name}[{i}]={length} is past the longest prompt built here, {MAX_LENGTH} "
                                        f"tokens (retrieval.MAX_LENGTH: its text alone would take gigabytes)")
    return lengths


def check_depths(depths, name: str = "depths") -> list[float]:
    """`depths` as a non-empty list of shares of the haystack in [0, 1]."""
    depths = _listed(depths, name, "numbers in [0, 1]", "depth")
    for i, depth in enumerate(depths):
        check_number(f"{name}[{i}]", depth, minimum=0, maximum=1, optional=False)
    return depths


def framing(tokenizer, bos) -> list[int]:
    """`corpora.bos_prefix`, its refusals (a plain ValueError there) as the project's error, checked once before
    any sample is built."""
    try:
        return bos_prefix(tokenizer, bos)
    except PosEncError:
        raise
    except ValueError as err:
        raise InvalidParameterError(str(err)) from None


def check_haystack(haystack, needed: bool, what: str) -> None:
    """The haystack text: a non-empty str where the task hides its needles in real text, else None or a str."""
    if haystack is not None and not isinstance(haystack, str):
        raise ParameterTypeError(f"haystack must be a text (a str), got {haystack!r:.60} ({type(haystack).__name__})")
    if needed and not haystack:
        raise InvalidInputError(f"{what} hides its needles in real text: give a haystack text (e.g. a corpus document)")


@dataclass
class Trial:
    prompt: list[int]
    answer: list[int]
    length: int  # the length asked for; prompt + answer is at most that, within one haystack line
    depth: float  # the fraction of the haystack before the hidden fact
    needle_at: int | None = None  # the prompt token where the hidden fact starts


class Haystack:
    """A text split into lines (`texts`), each also tokenized once (`lines`) to size a token budget; `take`
    fills a budget with whole lines."""

    def __init__(self, tokenizer, text: str):
        if not isinstance(text, str):
            raise ParameterTypeError(f"the haystack must be a text (a str), got {text!r:.60} ({type(text).__name__})")
        texts = text.splitlines(keepends=True)
        kept = [(line, ids) for line, ids in zip(texts, tokenizer(texts, add_special_tokens=False)["input_ids"])
                if ids]
        if not kept:
            raise InvalidInputError("the haystack text is empty")
        self.texts = [line for line, _ in kept]
        self.lines = [ids for _, ids in kept]

    def take(self, budget: int, start: int = 0) -> list[list[int]]:
        """Consecutive lines from `start` (wrapping around) whose tokens fit in `budget`."""
        out, used, i = [], 0, start
        while used + len(self.lines[i % len(self.lines)]) <= budget:
            out.append(self.lines[i % len(self.lines)])
            used += len(out[-1])
            i += 1
        return out

    def text(self, start: int, count: int) -> list[str]:
        """The text of `count` consecutive lines from `start` (wrapping around)."""
        return [self.texts[(start + i) % len(self.texts)] for i in range(count)]


def build_trial(tokenizer, haystack: Haystack, *, needle: str, question: str, answer: str, length: int,
                depth: float, start: int = 0, bos: bool | str = "auto") -> Trial:
    """intro + haystack lines with `needle` inserted at the line boundary nearest `depth` + question;
    the answer follows the question. The prompt starts as `corpora.bos_prefix(tokenizer, bos)` says (by
    default as the tokenizer starts an input: BOS first for Llama, Gemma, Mistral).

    The trial is written as text and tokenized once, prompt and answer together, as lm-eval (or anyone
    re-encoding the decoded prompt) sees it: where the pieces meet, the tokenizer merges what it merges
    (".\n" + "\nWhat" is one "\n\n"). The answer is the tokens that reach past the prompt's text, and
    `needle_at` the token holding the needle's first character (character offsets: a fast tokenizer). As
    many whole haystack lines as fit in `length` tokens, prompt and answer together."""
    check_number("depth", depth, minimum=0, maximum=1, optional=False)
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidInputError(
            f"retrieval trials find the answer by the tokenizer's character offsets, which only a fast tokenizer "
            f"gives; {type(tokenizer).__name__} is not one (load it with use_fast=True)")
    head = bos_prefix(tokenizer, bos)

    def build(count: int) -> tuple[int, tuple]:
        """(tokens, what the trial needs) with `count` haystack lines."""
        lines = haystack.text(start, count)
        cut = round(depth * count)
        before = INTRO + "".join(lines[:cut])
        prompt = before + needle + "".join(lines[cut:]) + question
        encoded = tokenizer(prompt + answer, add_special_tokens=False, return_offsets_mapping=True)
        return len(head) + len(encoded["input_ids"]), (len(prompt), len(before), encoded)

    size, built = build(0)
    if size > length:
        raise InvalidParameterError(f"length {length} is too short for the retrieval prompt ({size} tokens "
                         f"without any haystack)")
    count = len(haystack.take(length - size, start))  # the lines' tokens apart: what they take joined, nearly
    size, built = build(count)
    while count and size > length:  # joined, they took more
        count -= 1
        size, built = build(count)
    while extra := len(haystack.take(length - size, start + count)):  # joined, they took less: fill the rest
        more = build(count + extra)
        if more[0] > length and extra > 1:
            extra, more = 1, build(count + 1)
        if more[0] > length:
            break
        count, (size, built) = count + extra, more
    end, needle_char, encoded = built
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    split = next(i for i, (_, stop) in enumerate(offsets) if stop > end)
    needle_at = next(i for i, (_, stop) in enumerate(offsets) if stop > needle_char)
    return Trial(prompt=head + ids[:split], answer=ids[split:], length=length, depth=depth,
                 needle_at=len(head) + needle_at)


def make_trials(task: str, tokenizer, *, lengths: Sequence[int], depths: Sequence[float], trials: int = 1,
                haystack: str | None = None, seed: int = 0, bos: bool | str = "auto") -> list[Trial]:
    """`trials` trials per (length, depth), each with its own random key (same seed, same trials).
    `haystack` is the text of the needle task (ignored by passkey, which uses its filler line); `bos`
    as in `build_trial`."""
    if task not in KINDS:
        raise InvalidParameterError(f"unknown retrieval task {task!r}; known: {', '.join(KINDS)}")
    if not callable(tokenizer):
        raise InvalidInputError(f"tokenizer must be a transformers tokenizer (hp.load_tokenizer), got {tokenizer!r:.60}")
    if isinstance(lengths, Sequence) and isinstance(depths, Sequence) and (not lengths or not depths):
        raise InvalidParameterError(f"make_trials needs at least one length and one depth, got lengths="
                                    f"{list(lengths)}, depths={list(depths)}")
    lengths, depths = check_lengths(lengths), check_depths(depths)
    check_number("trials", trials, minimum=1, integer=True, optional=False)
    check_number("seed", seed, integer=True, optional=False)
    check_haystack(haystack, task == "needle", "the needle task")
    framing(tokenizer, bos)
    hay = Haystack(tokenizer, FILLER if task == "passkey" else haystack)
    rng, out = random.Random(seed), []
    for length in lengths:
        for depth in depths:
            for _ in range(trials):
                if task == "passkey":
                    key = rng.randint(10000, 99999)
                    needle, question = f"The pass key is {key}. Remember it. {key} is the pass key.\n", \
                        "\nWhat is the pass key? The pass key is"
                    start = 0
                else:
                    word, key = rng.choice(KEYS), rng.randint(1_000_000, 9_999_999)
                    needle = f"One of the special magic numbers for {word} is: {key}.\n"
                    question = (f"\nWhat is the special magic number for {word} mentioned in the provided text? "
                                f"The special magic number for {word} mentioned in the provided text is")
                    start = rng.randrange(len(hay.lines))
                out.append(build_trial(tokenizer, hay, needle=needle, question=question, answer=f" {key}",
                                       length=length, depth=depth, start=start, bos=bos))
    return out


def _answer_logits(model: torch.nn.Module, ids: torch.Tensor, keep: int) -> torch.Tensor:
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        return model(ids, use_cache=False, logits_to_keep=keep).logits
    return model(ids, use_cache=False).logits[:, -keep:]


@torch.inference_mode()
def score_trials(model: torch.nn.Module, trials: Sequence[Trial], *, progress: bool = True) -> list[dict]:
    """For each trial: "correct" (greedy decoding gives the answer) and "logprob" (of the whole answer)."""
    check_causal_lm(model, "score_trials")
    if isinstance(trials, (str, bytes)) or not isinstance(trials, Sequence) or not trials \
            or not all(isinstance(t, Trial) for t in trials):
        raise InvalidInputError(f"trials must be a non-empty list of the Trials make_trials gives, got {trials!r:.60}")
    for i, trial in enumerate(trials):
        check_token_ids(model, torch.tensor(trial.prompt + trial.answer), f"trials[{i}]")
    check_length(model, max(len(t.prompt) + len(t.answer) for t in trials))   # before any pass
    out = []
    for trial in tqdm(trials, desc="retrieval", unit="trial", disable=not progress):
        ids = torch.tensor([trial.prompt + trial.answer], device=model.device)
        target = torch.tensor(trial.answer, device=model.device)
        logits = _answer_logits(model, ids, len(trial.answer) + 1)[0, :-1].float()
        out.append({"correct": bool((logits.argmax(-1) == target).all()),
                    "logprob": logits.log_softmax(-1).gather(-1, target[:, None]).sum().item()})
    return out


def summarize(trials: Sequence[Trial], scores: Sequence[dict]) -> dict:
    """Accuracy per (depth, length) cell ("accuracy"[depth][length]) and per length ("by_length")."""
    if not isinstance(trials, Sequence) or not isinstance(scores, Sequence):
        raise InvalidInputError(f"summarize needs the list of trials and the list of their scores, got "
                                f"{type(trials).__name__} and {type(scores).__name__}")
    if len(trials) != len(scores):
        raise InvalidInputError(f"summarize needs one score per trial, got {len(trials)} trials and {len(scores)} "
                                f"scores")
    if not trials:
        raise InvalidInputError("summarize needs at least one trial and its score, got none")
    for i, (trial, score) in enumerate(zip(trials, scores)):
        if not isinstance(trial, Trial) or not isinstance(score, dict) or not {"correct", "logprob"} <= set(score):
            raise InvalidInputError(f"summarize needs Trials and score_trials' scores ({{'correct', 'logprob'}}); "
                                    f"entry {i} is {trial!r:.40} and {score!r:.40}")
    lengths = sorted({t.length for t in trials})
    depths = sorted({t.depth for t in trials})

    def mean(values):
        return sum(values) / len(values) if values else float("nan")

    cells = {(d, n): [s["correct"] for t, s in zip(trials, scores) if (t.depth, t.length) == (d, n)]
             for d in depths for n in lengths}
    return {
        "lengths": lengths, "depths": depths, "trials": len(trials),
        "accuracy": [[mean(cells[d, n]) for n in lengths] for d in depths],
        "by_length": [mean([c for d in depths for c in cells[d, n]]) for n in lengths],
        "mean_logprob": mean([s["logprob"] for s in scores]),
    }
