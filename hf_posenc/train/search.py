"""A search for RoPE's per-pair rescale factors (LongRoPE, Ding et al. 2024; LongRoPE2, Shang et al. 2025), saved
as a stock `longrope` config that transformers, vLLM and llama.cpp run.

One factor per rotary pair, lambda_i (pair 0 turns fastest): the pair's frequency is divided by lambda_i past the
original context. LongRoPE searches the whole vector; on a CPU, where a candidate costs a long forward pass, this
searches a low-dimensional form of it that holds the constraints by construction (every factor >= 1, non-decreasing
toward the slow pairs) and contains the closed forms' shapes:

    lambda_i = top ** r_i,   r_i = clip((i - start) / width, 0, 1) ** shape

pairs up to `start` keep their frequency (the critical dimension: they turn often enough inside the original
context to have seen every rotation), the slowest reach `top` (a multiple of the factor s); NTK is start 0, width
the whole, shape 1, top s; PI a step at 0. The attention factor (the scale on cos and sin) is a fifth dimension,
optionally.

Fitness, LongRoPE2's "needle-driven" loss: recall at a distance (hf_posenc/eval/recall.py) on a tuning text, the
mean loss of the repeated passages whose first copy lies at least `far_from` tokens back: tokens only far context
predicts. One pass a sequence, no control pass: a candidate that damages the model raises this loss too, where a
gap against a control would forgive it. Guard: perplexity of the first `guard_length` tokens of the text (inside
the original context); a candidate that raises it by more than `guard_share` is rejected before its long pass.

Optimizer: CMA-ES (Hansen 2016) from the `cmaes` package, started from the best of the seeds (the closed forms PI,
NTK, YaRN, llama3 and the ramp, each evaluated with its exact factors, then projected into the form). CMA-ES
ranks candidates only, so the guard's rejections rank last by how far they missed; `cmaes` is a small numpy
library whose ask/tell loop replays a search exactly from its seed, which is how a killed search resumes.

    space = FactorSpace(pairs=32, factor=2.0)
    run = FactorSearch(model, tokenizer, text, target=16384, out="runs/search", budget=24)
    best = run.run()          # every candidate appended to out/candidates.jsonl as it completes
    save_best(model, best, "runs/search/best")
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import _compat, api
from ..config import MAX_POSITIONS, check_number
from ..errors import ConfigError, InvalidInputError, InvalidParameterError
from ..eval import recall, stats
from ..eval.perplexity import as_token_ids, pass_progress, token_nll
from ..export.serving import whole_file
from ..record_reader import read_record

SEEDS = ("linear", "ntk", "yarn", "llama3", "longrope")   # the closed forms the population starts from
SEED_NAMES = {"linear": "PI", "ntk": "NTK", "yarn": "YaRN", "llama3": "llama3", "longrope": "ramp"}
MODES = ("switched", "static")   # short factors 1 (the unpatched model inside the original context), or = long
REJECTED = 1000.0   # what a rejected candidate scores, plus how far it missed: below every accepted one


@dataclass(frozen=True)
class FactorSpace:
    """The searched form of the factors of `pairs` rotary pairs at a factor s = target / original (see the module's
    docstring): a point is x in [0, 1]^k, k = 4 (start, width, top, shape) or 5 (and the attention factor)."""

    pairs: int
    factor: float
    original: int
    top_range: tuple[float, float] = (0.75, 2.0)     # the slowest pair's factor, in multiples of s (>= 1 overall)
    attention_range: tuple[float, float] | None = (1.0, 1.3)   # None: longrope's default attention factor
    shape_range: tuple[float, float] = (0.25, 4.0)
    floor_from: int | None = None    # pairs from this one on get at least floor x s (LongRoPE2: past the critical pair)
    floor: float = 1.0               # that floor, in multiples of s

    def __post_init__(self) -> None:
        check_number("pairs", self.pairs, minimum=2, integer=True, optional=False)
        check_number("floor_from", self.floor_from, minimum=0, maximum=self.pairs, integer=True)
        check_number("factor", self.factor, above=1, maximum=MAX_POSITIONS, optional=False)
        check_number("floor", self.floor, minimum=1, maximum=MAX_POSITIONS, optional=False)
        if self.floor_from is not None and self.floor > self.top_range[1]:
            raise InvalidParameterError(f"the critical pairs' floor {self.floor:g} x s is above top_range high "
                                        f"{self.top_range[1]:g} x s: the slowest pair could not reach it")
        for name in ("top_range", "attention_range", "shape_range"):
            bounds = getattr(self, name)
            if bounds is None and name == "attention_range":
                continue
            if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
                raise InvalidParameterError(f"{name} must be [low, high], got {bounds!r}")
            for end, value in zip(("low", "high"), bounds):
                check_number(f"{name} {end}", value, above=0, maximum=MAX_POSITIONS, optional=False)
            if bounds[0] > bounds[1]:
                raise InvalidParameterError(f"{name} is inverted: low {bounds[0]} > high {bounds[1]}")
        if self.attention_range is not None and self.attention_range[0] < 1:
            raise InvalidParameterError(f"attention_range low must be >= 1 (no scale below the unpatched model's), "
                                        f"got {self.attention_range[0]}")
        top_high = self.top_range[1] * self.factor
        if top_high < 1:
            raise InvalidParameterError(f"top_range {list(self.top_range)} times the factor {self.factor:g} stays "
                                        f"below 1: every factor must be >= 1")
        if top_high * self.original > MAX_POSITIONS:
            raise InvalidParameterError(
                f"top_range high {self.top_range[1]} times the factor {self.factor:g} stretches the slowest pair "
                f"to {top_high * self.original:.3g} positions, past {MAX_POSITIONS}")

    @property
    def dims(self) -> int:
        return 4 if self.attention_range is None else 5

    @property
    def tops(self) -> tuple[float, float]:
        low = max(1.0, self.top_range[0] * self.factor)
        if self.floor_from is not None and self.floor_from < self.pairs:
            low = max(low, self.floor * self.factor)   # the slowest pair lies past the critical pair
        return low, max(low, self.top_range[1] * self.factor)

    def _factors(self, x: np.ndarray) -> np.ndarray:
        """The factors of every pair at each point of x [points, >= 4], [points, pairs]."""
        x = np.clip(x, 0.0, 1.0)
        last = self.pairs - 1
        start = x[:, :1] * (last + 1) - 1      # from -1 (every pair rescaled: PI) to the last pair
        width = x[:, 1:2] * (last - start)
        low, high = self.tops
        top = low * (high / low) ** x[:, 2:3]
        shape = self.shape_range[0] * (self.shape_range[1] / self.shape_range[0]) ** x[:, 3:4]
        i = np.arange(self.pairs, dtype=np.float64)[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            ramp = np.where(width < 1e-9, (i > start).astype(np.float64),
                            np.clip((i - start) / np.maximum(width, 1e-9), 0.0, 1.0) ** shape)
        factors = np.maximum(1.0, top ** ramp)
        if self.floor_from is not None:
            factors[:, self.floor_from:] = np.maximum(factors[:, self.floor_from:], self.floor * self.factor)
        return np.maximum.accumulate(factors, axis=1)   # non-decreasing, also where rounding would break it

    def point(self, x: Sequence[float]) -> tuple[list[float], float | None]:
        """(the factors of every pair, the attention factor or None) at the point x."""
        try:
            x = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidInputError(f"a point of the form is {self.dims} numbers in [0, 1], got {x!r:.80}") from None
        if x.shape != (self.dims,) or not np.isfinite(x).all():
            raise InvalidInputError(f"a point of the form is {self.dims} finite numbers in [0, 1] (start, width, top, "
                                    f"shape{', attention' if self.dims == 5 else ''}), got {x.tolist()!r:.80}")
        x = np.clip(x, 0.0, 1.0)
        factors = self._factors(x[None, :])[0]
        attention = None
        if self.attention_range is not None:
            a, b = self.attention_range
            attention = float(a + (b - a) * x[4])
        return [float(round(f, 6)) for f in factors], attention

    def fit(self, factors: Sequence[float], attention: float | None = None) -> np.ndarray:
        """The point whose factors are nearest `factors` in log (and whose attention factor is nearest): how a
        closed form becomes CMA-ES's start. A coarse grid, then finer grids around the best."""
        target = np.log(np.asarray(factors, dtype=np.float64))
        if target.shape != (self.pairs,):
            raise InvalidParameterError(f"fit needs {self.pairs} factors (one per rotary pair), got {len(target)}")
        grid = np.linspace(-1.0, 1.0, 11)
        centre, span = np.full(4, 0.5), 0.5
        for _ in range(5):
            axes = [np.clip(c + grid * span, 0, 1) for c in centre]
            points = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 4)
            errors = np.square(np.log(self._factors(points)) - target).sum(axis=1)
            centre, span = points[int(errors.argmin())], span / 4
        if self.attention_range is None:
            return centre
        a, b = self.attention_range
        share = 0.0 if attention is None or b == a else (float(attention) - a) / (b - a)
        return np.append(centre, np.clip(share, 0.0, 1.0))


def critical_pair(inv_freq: Sequence[float] | torch.Tensor, original: int) -> int:
    """The first rotary pair that never turned a full period inside the original context (its period 2 pi / theta_i
    longer than `original`): LongRoPE2's critical dimension, as a pair index (= ceil((d/2) log_base(L / 2 pi)) for
    theta_i = base^(-2i/d)). Pairs from it on saw only part of their rotations in training."""
    theta = torch.as_tensor(inv_freq, dtype=torch.float64)
    return int((2 * math.pi / theta <= original).sum())


def rotary_module(model: torch.nn.Module) -> torch.nn.Module:
    """The model's one rotary module (a model with one RoPE for every layer)."""
    return _compat.single_rotary(model, "the factor search takes")


def closed_forms(model: torch.nn.Module, target: int) -> list[tuple[str, list[float], float]]:
    """(name, the factor of every pair, the attention factor) of each seed method patched to `target`: the
    frequencies it gives past the original context, divided into the unpatched ones. A method the model's config
    cannot carry (Phi-3 takes longrope only) is no seed: its factors could not be saved as that method."""
    from ..errors import MethodNotApplicableError
    from ..eval.variants import variant_params

    rotary = rotary_module(model)
    before = rotary.inv_freq.detach().double().clone()
    out = []
    for name in SEEDS:
        params = variant_params(model, name, {}, target)
        try:   # refused before the model changes
            with api.patched(model, name, **params) as patched:
                rotary = rotary_module(patched)
                after = _compat.rope_init(patched.config.get_text_config(), None, target, type(rotary))
                factors = (before / after[0].double()).tolist()
                attention = float(after[1])
        except MethodNotApplicableError:
            continue
        out.append((name, [float(round(max(1.0, f), 6)) for f in factors], attention))
    return out


def longrope_params(factors: Sequence[float], attention: float | None, mode: str, target: int) -> dict:
    """hp.patch parameters of the `longrope` patch that a candidate is."""
    if mode not in MODES:
        raise InvalidParameterError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    params = {"long_factor": list(factors), "max_position_embeddings": target}
    params["short_factor"] = list(factors) if mode == "static" else [1.0] * len(factors)
    if attention is not None:
        params["attention_factor"] = attention
    return params


@dataclass
class SearchSettings:
    """What makes two searches the same search: a resume with any of these changed is refused naming it."""

    model: str
    target: int
    original: int
    mode: str = "switched"
    budget: int = 24                 # candidates after the seeds
    passages: int = 24
    passage_tokens: int = 192
    far_from: int | None = None      # None: the original context
    guard_length: int = 2048
    guard_share: float = 0.01
    top_range: list[float] = field(default_factory=lambda: [0.75, 2.0])
    attention_range: list[float] | None = field(default_factory=lambda: [1.0, 1.3])
    sigma: float = 0.25
    population: int = 0              # 0: CMA-ES's default, 4 + 3 ln(dims)
    seed: int = 0
    corpus: str = "shakespeare"
    dtype: str = "float32"
    band_width: int | None = None    # None: one pool past `far`; else passages spread evenly over bands of this width
    critical_floor: bool | float = False   # pairs past the critical one get at least s (true) or this multiple of s
    race: bool = False               # score the first sequence, stop a candidate it shows clearly worse than the best

    def __post_init__(self) -> None:
        check_number("target", self.target, minimum=2, maximum=MAX_POSITIONS, integer=True, optional=False)
        check_number("original", self.original, minimum=1, integer=True, optional=False)
        if self.target <= self.original:
            raise InvalidParameterError(f"target {self.target} must be longer than the model's original context "
                                        f"{self.original}: there is nothing to extend")
        if self.mode not in MODES:
            raise InvalidParameterError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        check_number("budget", self.budget, minimum=0, maximum=100000, integer=True, optional=False)
        check_number("passages", self.passages, minimum=2, integer=True, optional=False)
        check_number("far_from", self.far_from, minimum=0, maximum=self.target - 1, integer=True)
        check_number("guard_length", self.guard_length, minimum=2, maximum=self.original, integer=True,
                     optional=False)
        check_number("guard_share", self.guard_share, minimum=0, maximum=1, optional=False)
        check_number("sigma", self.sigma, above=0, maximum=1, optional=False)
        check_number("population", self.population, minimum=0, maximum=1000, integer=True, optional=False)
        check_number("seed", self.seed, minimum=0, maximum=2**32 - 1, integer=True, optional=False)   # numpy's range
        for name in ("top_range", "attention_range"):
            value = getattr(self, name)
            if not (isinstance(value, (list, tuple)) or (value is None and name == "attention_range")):
                raise InvalidParameterError(f"{name} must be [low, high]"
                                            f"{' or None' if name == 'attention_range' else ''}, got {value!r}")
        if 0 < self.population < 4:   # CMA-ES recombines the best half: 2 at least
            raise InvalidParameterError(f"population must be 0 (CMA-ES's default) or >= 4, got {self.population}")
        if not isinstance(self.race, bool):
            raise InvalidParameterError(f"race must be true or false, got {self.race!r}")
        if not isinstance(self.critical_floor, bool):
            if not isinstance(self.critical_floor, (int, float)) or not 1 <= self.critical_floor < math.inf:
                raise InvalidParameterError(f"critical_floor must be true, false or a multiple of s = target / "
                                            f"original, >= 1, got {self.critical_floor!r}")
        check_number("band_width", self.band_width, minimum=self.passage_tokens, integer=True)
        if self.band_width is not None and self.band_width > self.target - self.far:
            raise InvalidParameterError(
                f"band_width {self.band_width} is wider than the distances it bands ({self.far} to the target "
                f"{self.target}: {self.target - self.far} tokens): use at most {self.target - self.far}")
        per_sequence, sequences = recall.cell_sequences(self.target, self.passages, self.passage_tokens)
        if self.band_width is not None and per_sequence < 2 * len(self.bands):
            raise InvalidParameterError(
                f"{len(self.bands)} bands of {self.band_width} tokens need 2 passages each in every sequence; a "
                f"sequence holds {per_sequence} of the {self.passages} passages: use more passages or wider bands")
        if self.race and sequences < 2:
            raise InvalidParameterError(
                f"race scores the first of several sequences, but {self.passages} passages of {self.passage_tokens} "
                f"tokens fit in one {self.target}-token sequence: use at least {2 * per_sequence} passages, or no race")
        self.space(critical=0)   # the bounds (and the floor against the top), checked by the space itself
        self.layout(head=1)

    @property
    def sequence_passages(self) -> int:
        return recall.cell_sequences(self.target, self.passages, self.passage_tokens)[0]

    @property
    def far(self) -> int:
        return self.original if self.far_from is None else self.far_from

    @property
    def bands(self) -> list[tuple[int, int]]:
        """The distance bands the fitness weighs alike, [from, to) from `far` to the target (one band unbanded)."""
        width = self.band_width or self.target - self.far
        edges = list(range(self.far, self.target, width))
        return [(a, min(a + width, self.target)) for a in edges]

    def band_distances(self, head: int) -> list[int]:
        """The distance of each passage of a sequence: as evenly as they go over the bands, the far bands first
        to get a passage more, each band's passages evenly inside it (the longest distance a sequence holds
        caps the last band)."""
        bands, count = self.bands, self.sequence_passages
        longest = self.target - head - self.passage_tokens
        out = []
        for b, (low, high) in enumerate(bands):
            k = count // len(bands) + (1 if len(bands) - b <= count % len(bands) else 0)
            low, high = max(low, self.passage_tokens), min(high, longest)
            out += [int(low + (j + 0.5) * (high - low) / k) for j in range(k)]
        return out

    def layout(self, head: int = 0) -> recall.Layout:
        """Where the passages sit (the same for every candidate), refused when none lies `far` back."""
        distances = None if self.band_width is None else self.band_distances(head)
        layout = recall.plan_layout(self.target, passages=self.sequence_passages, passage_tokens=self.passage_tokens,
                                    distances=distances, head=head, seed=self.seed)
        if not any(d >= self.far for d in layout.distances):
            raise InvalidParameterError(
                f"far_from {self.far}: no passage of a {self.target}-token sequence lies that far back (the longest "
                f"distance is {max(layout.distances)}); use a shorter far_from or a longer target")
        return layout

    def recall_sets(self, tokenizer, text_ids: Sequence[int], prefix: Sequence[int] = ()) -> list[recall.RecallSet]:
        """The recall sequences every candidate is scored on (refused when the text is too short for them)."""
        sequences = recall.cell_sequences(self.target, self.passages, self.passage_tokens)[1]
        return recall.make_recall(tokenizer, text_ids, self.layout(head=len(prefix)), sequences=sequences,
                                  seed=self.seed, prefix=prefix)

    @property
    def floor(self) -> float | None:
        """The critical pairs' floor in multiples of s (true: 1), or None (no floor)."""
        if isinstance(self.critical_floor, bool):
            return 1.0 if self.critical_floor else None
        return float(self.critical_floor)

    @property
    def floor_factor(self) -> float | None:
        """The least factor of the pairs from the critical one on (floor x s), or None (no floor)."""
        return None if self.floor is None else self.floor * self.target / self.original

    def space(self, pairs: int = 2, critical: int | None = None) -> FactorSpace:
        attention = None if self.attention_range is None else tuple(self.attention_range)
        floor_from = min(critical, pairs) if self.floor is not None and critical is not None else None
        return FactorSpace(pairs=pairs, factor=self.target / self.original, original=self.original,
                           top_range=tuple(self.top_range), attention_range=attention, floor_from=floor_from,
                           floor=self.floor or 1.0)


EXTENDABLE = ("budget",)   # a rerun may ask for more candidates (or fewer): the search replays to there


def check_resume(saved: dict, settings: dict, path: Path) -> None:
    """A search resumed with other settings would mix two searches in one record: refused naming each field. A
    field the record predates reads as its default (the search it holds ran without it)."""
    if not isinstance(saved, dict):
        raise InvalidInputError(f"{path}: its settings are not a mapping of fields (got {saved!r:.60}): the file was "
                                f"edited; move it away to start again")
    saved = _with_defaults(saved)
    differ = [k for k in sorted(set(saved) | set(settings))
              if k not in EXTENDABLE and json.dumps(saved.get(k)) != json.dumps(settings.get(k))]
    if differ:
        shown = "; ".join(f"{k}: {json.dumps(saved.get(k))} there, {json.dumps(settings.get(k))} now" for k in differ)
        raise ConfigError(f"{path} holds a search with other settings ({shown}); resume with its settings, or name "
                          f"another output folder")


def _with_defaults(settings: dict) -> dict:
    """A record's settings with each field it predates at its default (the search it holds ran without it)."""
    defaults = {f.name: f.default for f in dataclasses.fields(SearchSettings) if f.default is not dataclasses.MISSING}
    return {**{k: v for k, v in defaults.items() if k not in settings}, **settings}


IDENTITY = ("settings", "text", "weights")   # what a line of candidates.jsonl carries: the search that scored it


def candidate_identity(record: dict, path: Path) -> dict:
    """The identity every line of candidates.jsonl carries, of the search whose record (search.json at `path`, or
    FactorSearch.record) is `record`: sha256 of its settings as a resume compares them (the budget left out: a rerun
    may change it), of its text and of its weights. A record without the text's and weights' hashes, or without its
    number of rotary pairs, cannot show whose candidates it holds: refused."""
    identity, pairs = record.get("identity"), record.get("pairs")
    if not (isinstance(identity, dict) and all(isinstance(identity.get(k), str) for k in ("text", "weights"))):
        raise InvalidInputError(f"{path} has no identity (the sha256 of the text and of the weights its search "
                                f"scored, got {json.dumps(identity)[:40]}): nothing shows that its candidates were "
                                f"scored on this text and these weights, so they are not trusted; start over in a "
                                f"fresh output folder")
    if not (isinstance(pairs, int) and not isinstance(pairs, bool) and pairs >= 2):
        raise _edited(path, f"has pairs {json.dumps(pairs)[:40]}, where a search writes its model's rotary pairs "
                            f"(an integer >= 2)")
    settings = {k: v for k, v in _with_defaults(record["settings"]).items() if k not in EXTENDABLE}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    return {"settings": digest, "text": identity["text"], "weights": identity["weights"]}


def resume_record(path: Path, settings: dict) -> dict:
    """search.json of the search that `settings` resume: read, its settings checked to be these, and its identity
    there (see candidate_identity); each refused naming the file and what differs."""
    record = read_search(path)
    check_resume(record["settings"], settings, path)
    candidate_identity(record, path)
    return record


CANDIDATE_KEYS = ("index", "kind", "long_factor", "mode", "rejected", "value", "guard_rise")   # never None
RECORD_KEYS = {"settings": dict, "passages": list, "unpatched_guard_perplexity": float}   # what a resume reads


EDITED = "the file was edited or damaged; move it away to start again"


def _edited(path: Path, what: str) -> InvalidInputError:
    return InvalidInputError(f"{path} {what}: {EDITED}")


def read_search(path: Path) -> dict:
    """search.json as a search wrote it, refused naming the file and what is wrong with it (empty, cut short, not a
    JSON object, a key missing or of another kind)."""
    if not path.is_file():
        raise InvalidInputError(f"{path} is not a file: a search's search.json is")
    raw = path.read_bytes()
    if not raw.strip():
        raise _edited(path, "is empty")
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _edited(path, f"is not JSON ({type(err).__name__} at byte {getattr(err, 'pos', getattr(err, 'start', '?'))})") from None
    if not isinstance(record, dict):
        raise _edited(path, f"holds {type(record).__name__} {json.dumps(record)[:40]}, not a search's record")
    for key, kind in RECORD_KEYS.items():
        value = record.get(key)
        ok = _finite(value) and value > 0 if kind is float else isinstance(value, kind)
        if not ok:
            raise _edited(path, f"has {key} {json.dumps(value)[:40]}, where a search writes "
                                f"{'a positive number' if kind is float else 'a ' + kind.__name__}")
    return record


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite_numbers(value, least: float | None = None) -> bool:
    return isinstance(value, list) and bool(value) and all(_finite(v) and (least is None or v >= least) for v in value)


def _candidate_fault(row: dict) -> str | None:
    """What is wrong with a parsed line of candidates.jsonl (None: a candidate as the search writes it)."""
    missing = [k for k in CANDIDATE_KEYS if row.get(k) is None]
    if missing:
        return f"is not a candidate (no {', '.join(missing)})"
    if not isinstance(row["kind"], str) or not isinstance(row["rejected"], bool):
        return "is not a candidate (its kind or rejected is of another type)"
    for key in ("value", "guard_rise"):
        if not _finite(row[key]):
            return f"has {key} {row[key]!r}: a finite number is written there"
    if not _finite_numbers(row["long_factor"], least=1.0):
        return "has a long_factor that is not a list of finite numbers >= 1"
    if row["kind"].startswith("cma:") and not (_finite_numbers(row.get("x")) and all(0 <= v <= 1 for v in row["x"])):
        return f"has x {json.dumps(row.get('x'))[:40]}: a CMA-ES candidate's point is numbers in [0, 1]"
    if not row["rejected"] and not (_finite_numbers(row.get("losses")) and isinstance(row.get("distances"), list)
                                    and len(row["distances"]) == len(row["losses"])):
        return "has no losses and distances of its passages (finite numbers, one each)"
    return None


def read_candidates(path: Path, record: dict | None = None, *, unmarked: bool = False) -> list[dict]:
    """The candidates a search has finished, in order. A search writes each as one line of ASCII JSON and its
    newline, so only a last line with no newline can be a write a kill cut short (dropped: that candidate runs
    again); any other line that is not a candidate, bytes that are not UTF-8 text included, is refused naming the
    file and the line.

    With the search's `record` (search.json, or FactorSearch.record: what a resume reads them with), every line must
    be that search's: carry its identity (candidate_identity; a line of another search, or one written before lines
    carried it, is refused, not replayed), one factor for each of its rotary pairs, and a point of its form.
    `unmarked`: a line with no identity is taken as the record's, for a reader that says so (bench_search.py
    --transfer --unmarked-candidates: the records committed before lines carried one). Without a record: the lines
    as written (a finished search's figure and summary)."""
    if not path.exists():
        return []
    if not path.is_file():
        raise InvalidInputError(f"{path} is not a file: a search's candidates.jsonl is")
    identity = None if record is None else candidate_identity(record, path.with_name("search.json"))
    out = []
    lines = path.read_bytes().split(b"\n")   # the last: empty after a final newline, or a line with none
    for number, raw in enumerate(lines, 1):
        last = number == len(lines)
        try:
            row = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except UnicodeDecodeError as err:
            raise _edited(path, f"line {number} is not JSON: it holds bytes that are not UTF-8 text (at byte "
                                f"{err.start} of the line; a search writes ASCII)") from None
        except ValueError:   # not JSON (json.JSONDecodeError), or a NaN or Infinity
            if last:
                continue   # a killed write (or nothing after the final newline): that candidate runs again
            raise InvalidInputError(f"{path} line {number} is not JSON (only a last line with no newline after it "
                                    f"can be a write a kill cut short): the file was edited; move it away to start "
                                    f"again") from None
        fault = _candidate_fault(row) if isinstance(row, dict) else f"is not a candidate (it holds {type(row).__name__})"
        if fault:
            raise _edited(path, f"line {number} {fault}")
        stranger = None if record is None else _not_of_search(row, identity, record, unmarked)
        if stranger:
            raise InvalidInputError(f"{path} line {number} {stranger}")
        if row.get("index") != len(out):
            raise InvalidInputError(f"{path} line {number}: candidate {row.get('index')} where {len(out)} was due: "
                                    f"the file was edited; move it away to start again")
        out.append(row)
    return out


def _not_of_search(row: dict, identity: dict, record: dict, unmarked: bool) -> str | None:
    """Why a parsed line is not a candidate of the search `record` holds, and what to do (None: it is one); the
    caller names the file and the line (read_candidates)."""
    fresh = "start over in a fresh output folder"
    mark = row.get("identity")
    if mark is None and not unmarked:
        return (f"carries no identity of the search that scored it (the sha256 of its settings, text and weights; "
                f"lines written before candidates carried it have none): nothing shows it is this search's, so it is "
                f"not replayed; {fresh}")
    if mark is not None and mark != identity:
        theirs = mark if isinstance(mark, dict) else {}
        differ = [k for k in IDENTITY if theirs.get(k) != identity[k]]
        shown = "; ".join(f"{k} sha256 {str(theirs.get(k))[:12]} there, {identity[k][:12]} now" for k in differ)
        return (f"was scored by another search, of other {' and '.join(differ)} ({shown}): a line copied from "
                f"another record is not replayed; {fresh}")
    pairs, factors = record["pairs"], len(row["long_factor"])
    if factors != pairs:
        return f"has {factors} factors in long_factor, where the search's model has {pairs} rotary pairs: {EDITED}"
    dims = 4 if _with_defaults(record["settings"])["attention_range"] is None else 5
    if row.get("x") is not None and len(row["x"]) != dims:
        return (f"has {len(row['x'])} numbers in x, where a point of the search's form has {dims} (start, width, "
                f"top, shape{', attention' if dims == 5 else ''}): {EDITED}")
    return None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a search writes")


def write_whole(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all: a kill leaves the old file or none, never half of it."""
    with whole_file(path) as tmp:
        tmp.write_text(text)


def text_identity(ids: Sequence[int]) -> str:
    """sha256 of the token ids a search scores on: a resume on another text (an edited file of the same length
    included) is refused, never mixed into one record."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


def weights_identity(model: torch.nn.Module) -> str:
    """sha256 of the model's stored weights as loaded (names and bytes; the rope is not among them)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def keep_finished(path: Path, rows: list[dict]) -> None:
    """The file holds exactly `rows`: a line a kill cut short is dropped before the next one is appended."""
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows)
    if path.exists() and path.read_bytes() != text.encode():
        write_whole(path, text)


def append_candidate(path: Path, row: dict) -> None:
    """One candidate as one line, on disk before the next starts (a kill loses no finished candidate)."""
    text = json.dumps(row, allow_nan=False) + "\n"
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


class FactorSearch:
    """A factor search for `model` at `settings.target`, recorded in `out` (search.json, candidates.jsonl)."""

    def __init__(self, model: torch.nn.Module, tokenizer, text_ids: Sequence[int], settings: SearchSettings,
                 out: str | os.PathLike, *, prefix: Sequence[int] = (), progress: bool = True,
                 sets: list[recall.RecallSet] | None = None):
        if not isinstance(settings, SearchSettings):
            raise InvalidInputError(f"settings must be a SearchSettings (hf_posenc.train.search), got "
                                    f"{type(settings).__name__}")
        as_token_ids(text_ids, "text_ids")   # a string or floats refused, naming the argument
        if Path(out).exists() and not Path(out).is_dir():
            raise InvalidInputError(f"out {out} is a file: a search writes a folder (search.json, candidates.jsonl)")
        rotary = rotary_module(model)
        record = read_record(model.config)
        if record is not None:
            raise InvalidInputError(f"the model is already patched ({record.method}): search from the unpatched model")
        known = model.config.get_text_config().max_position_embeddings
        if settings.original != known:
            raise InvalidInputError(f"settings.original {settings.original} is not the model's original context "
                                    f"{known}: the factors would be searched for another model")
        self.model, self.settings, self.out, self.progress = model, settings, Path(out), progress
        self.pairs = int(rotary.inv_freq.numel())
        self.critical = critical_pair(rotary.inv_freq, settings.original)
        self.space = settings.space(self.pairs, self.critical)
        s = settings
        self.sets = sets if sets is not None else s.recall_sets(tokenizer, text_ids, prefix)   # `sets`: built before
        layout = self.sets[0].layout
        guard = list(prefix) + [int(t) for t in text_ids[:s.guard_length - len(prefix)]]
        self.guard_ids = torch.tensor([guard])
        self.record = {"settings": asdict(s), "pairs": self.pairs,
                       "identity": {"text": text_identity(list(prefix) + [int(t) for t in text_ids]),
                                    "weights": weights_identity(model)},
                       "passages": [{"sequence": r.index, "text_starts": r.passages} for r in self.sets],
                       "firsts": list(layout.firsts), "repeats": list(layout.repeats), "critical_pair": self.critical}
        self.identity = candidate_identity(self.record, self.out / "search.json")   # on every line it writes
        self._guards: dict[str, float] = {}

    # -- measuring -------------------------------------------------------------------------------------
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def guard_perplexity(self) -> float:
        nll = token_nll(self.model, self.guard_ids.to(self._device()))
        return float(torch.exp(nll.double().mean()))

    def _score(self, sets: Sequence[recall.RecallSet]) -> list[dict]:
        bar = pass_progress(self.model, "candidate", self.settings.original) if self.progress else \
            contextlib.nullcontext()
        with bar:   # a 32k pass: minutes on a CPU, a bar of its own
            rows = recall.score_recall(self.model, sets, control=False, progress=False)
        return [r for r in rows if r["distance"] >= self.settings.far]

    def weights(self, distances: Sequence[int]) -> np.ndarray:
        """Each passage's weight in the fitness, mean 1: every band weighs alike, however many passages it holds."""
        bands = self.settings.bands
        index = np.array([min(len(bands) - 1, sum(d >= a for a, _ in bands[1:])) for d in distances])
        counts = np.bincount(index, minlength=len(bands))
        present = int((counts > 0).sum())
        return len(distances) / (present * counts[index])

    def fitness(self, incumbent: dict | None = None) -> dict:
        """The repeats' loss of the passages at least `far` back, every band weighing alike (mean, interval, n), with
        each passage's loss and each band's mean. Racing against `incumbent` (the best fully scored candidate): the
        first sequence alone, and the rest only when its paired difference from the incumbent on the same passages
        does not already show it worse (the interval's lower end above 0)."""
        race = self.settings.race and incumbent is not None
        rows = self._score(self.sets[:1] if race else self.sets)
        raced_out, d = False, None
        if race:
            m = len(rows)
            w = self.weights([r["distance"] for r in rows])
            mine = np.array([r["loss_with"] for r in rows]) * w
            d = stats.paired_difference(mine.tolist(), (np.array(incumbent["losses"][:m]) * w).tolist())
            raced_out = bool(d["low"] > 0)
            if not raced_out:
                rows += self._score(self.sets[1:])
        losses = [r["loss_with"] for r in rows]
        weighted = np.array(losses) * self.weights([r["distance"] for r in rows])
        summary = stats.bootstrap_mean(weighted.tolist())
        gap = stats.bootstrap_mean([r["gap"] for r in rows])
        bands = []
        for a, b in self.settings.bands:
            inside = [r["loss_with"] for r in rows if a <= r["distance"] < b]
            bands.append({"from": a, "to": b, "n": len(inside),
                          "loss": round(float(np.mean(inside)), 5) if inside else None})
        out = {"loss": summary["mean"], "low": summary["low"], "high": summary["high"], "n": summary["n"],
               "gap_one_pass": gap["mean"], "losses": [round(v, 5) for v in losses],
               "distances": [r["distance"] for r in rows], "bands": bands, "raced_out": raced_out}
        if raced_out:   # ranked where its paired gap puts it: behind the incumbent by what the first sequence showed
            out["sequences_scored"] = 1
            out["estimate"] = incumbent["value"] + d["mean"]
        return out

    def evaluate(self, index: int, kind: str, factors: list[float], attention: float | None,
                 x: Sequence[float] | None, reference: float, incumbent: dict | None = None) -> dict:
        s = self.settings
        params = longrope_params(factors, attention, s.mode, s.target)
        start, cpu = time.perf_counter(), time.process_time()
        row = {"index": index, "kind": kind, "x": None if x is None else [float(v) for v in x],
               "long_factor": factors, "attention_factor": attention, "mode": s.mode}
        with api.patched(self.model, "longrope", **params):
            key = json.dumps([params["short_factor"], attention])
            if key not in self._guards:   # the guard's length sees only the short factors and the attention factor
                self._guards[key] = self.guard_perplexity()
            guard = self._guards[key]
            rise = guard / reference - 1
            row |= {"guard_perplexity": guard, "guard_rise": rise}
            if rise > s.guard_share:
                row |= {"rejected": True, "value": REJECTED + rise, "loss": None}
            else:
                row |= {"rejected": False, **self.fitness(incumbent)}
                row["value"] = row.pop("estimate", row["loss"])
        row["seconds"] = round(time.perf_counter() - start, 2)
        row["cpu_seconds"] = round(time.process_time() - cpu, 2)   # all threads of this process: the CPU cost
        return row

    def _check_constant_guard(self, factors: list[float], reference: float) -> None:
        """Switched, with the attention factor not searched, every candidate is the same model inside the original
        context: a guard it fails fails them all, refused before the first long pass."""
        s = self.settings
        if s.mode != "switched" or self.space.attention_range is not None:
            return
        with api.patched(self.model, "longrope", **longrope_params(factors, None, s.mode, s.target)) as model:
            rise = self.guard_perplexity() / reference - 1
            scale = float(rotary_module(model).attention_scaling)
        if rise > s.guard_share:
            raise ConfigError(
                f"every candidate of a switched search with the attention factor not searched is the unpatched model "
                f"inside the original context but for longrope's default attention factor {scale:.4g}, which raises "
                f"the guard's perplexity by {rise:.2%} (guard_share {s.guard_share:.1%}): search it "
                f"(attention_range [1.0, 1.1]) or allow more (guard_share)")

    # -- the loop --------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Seeds, then CMA-ES for `budget` candidates, each appended to candidates.jsonl as it completes; a rerun
        goes on after the last one written (with a larger budget: further). Returns the best accepted candidate; a
        search whose every candidate was rejected is refused."""
        try:
            from cmaes import CMA
        except ImportError:
            raise ConfigError("the factor search needs the cmaes package: pip install 'hf_posenc[search]'") from None
        with only_search(self.out):
            return self._run(CMA)

    def _saved(self, settings_path: Path) -> dict | None:
        """The saved search's record, once its settings, identity (text and weights) and passages are checked to be
        this run's (a resume); None for a new search."""
        if not settings_path.exists():
            return None
        saved = resume_record(settings_path, self.record["settings"])
        for what, why in (("text", "the tuning text's token ids (the corpus or the tokenizer changed)"),
                          ("weights", "the model's weights (another checkpoint, or the same one changed)")):
            there = saved["identity"][what]
            if there != self.record["identity"][what]:
                raise ConfigError(f"{settings_path} holds a search of other {what}: {why} differ from the "
                                  f"ones it scored (sha256 {there[:12]} there, {self.record['identity'][what][:12]}"
                                  f" now); resume with them, or name another output folder")
        if saved.get("passages") != self.record["passages"]:
            raise ConfigError(f"{settings_path} used other passages of the text (a changed corpus or "
                              f"tokenizer); name another output folder")
        return saved

    def _reference(self, settings_path: Path) -> float:
        """The unpatched model's guard perplexity, measured now and written with the settings (a new search)."""
        reference = self.guard_perplexity()
        if not math.isfinite(reference) or reference <= 0:
            raise InvalidInputError(f"the unpatched model's guard perplexity is {reference} on the first "
                                    f"{self.settings.guard_length} tokens: no candidate can be measured against "
                                    f"it (a model whose outputs are not finite in {self.settings.dtype}?)")
        self.record |= {"unpatched_guard_perplexity": reference, "started": time.strftime("%Y-%m-%d %H:%M")}
        write_whole(settings_path, json.dumps(self.record, indent=1))
        return reference

    def _run(self, CMA) -> dict:
        path = self.out / "candidates.jsonl"
        saved = self._saved(self.out / "search.json")
        done = read_candidates(path, self.record)   # each line this search's, or refused before anything is written
        reference = saved["unpatched_guard_perplexity"] if saved else self._reference(self.out / "search.json")
        keep_finished(path, done)
        seeds = closed_forms(self.model, self.settings.target)
        self._check_constant_guard(seeds[0][1], reference)
        total = len(seeds) + self.settings.budget
        # no tqdm estimate: it would average the guard's rejections (seconds) with the long passes (minutes)
        bar = tqdm(total=total, initial=min(len(done), total), desc="factor search", unit="candidate",
                   disable=not self.progress, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
        rows = list(done)

        def take(index: int, kind: str, factors, attention, x) -> dict:
            if index < len(done):
                old = done[index]
                same = old["kind"] == kind and np.allclose(old["long_factor"], factors, rtol=1e-5) and (
                    x is None or np.allclose(old["x"], x, atol=1e-9))
                if not same:
                    raise ConfigError(f"{path}: candidate {index} was {old['kind']}, this run asks {kind} with other "
                                      f"factors: the file was edited, or the search does not replay (another cmaes "
                                      f"version); name another output folder")
                return old
            scored = [r for r in rows if not r["rejected"] and not r.get("raced_out")]
            incumbent = min(scored, key=lambda r: r["value"], default=None)
            row = self.evaluate(index, kind, factors, attention, x, reference, incumbent) | {"identity": self.identity}
            append_candidate(path, row)
            rows.append(row)
            bar.update()
            best = min((r for r in rows if not r["rejected"]), key=lambda r: r["value"], default=None)
            left = time_left(rows, total)
            bar.set_postfix_str((f"best {best['loss']:.4f} ({best['kind']})" if best else "all rejected") +
                                (f", ~{left / 60:.0f} min left" if left is not None else ""))
            return row

        space = self.space
        for k, (name, factors, attention) in enumerate(seeds):
            if space.attention_range is None:
                attention = None
            else:
                attention = float(np.clip(attention, *space.attention_range))
            take(k, f"seed:{SEED_NAMES[name]}", factors, attention, None)
        start = min(rows[:len(seeds)], key=lambda r: r["value"])
        x0 = space.fit(start["long_factor"], start["attention_factor"])
        cma = CMA(mean=x0, sigma=self.settings.sigma, bounds=np.array([[0.0, 1.0]] * space.dims),
                  seed=self.settings.seed, population_size=self.settings.population or None)
        index = len(seeds)
        while index < total:
            generation = []
            for _ in range(cma.population_size):
                if index >= total:
                    break
                x = cma.ask()
                factors, attention = space.point(x)
                row = take(index, f"cma:{index - len(seeds) + 1}", factors, attention, x)
                generation.append((x, row["value"]))
                index += 1
            if len(generation) == cma.population_size:
                cma.tell(generation)
        bar.close()
        accepted = [r for r in rows if not r["rejected"] and not r.get("raced_out")]
        if not accepted:
            raise InvalidInputError(f"every candidate of {path} was rejected by the guard (perplexity at "
                                    f"{self.settings.guard_length} rose by more than {self.settings.guard_share:.1%}): "
                                    f"widen guard_share or the attention range")
        return min(accepted, key=lambda r: r["value"])


def time_left(rows: Sequence[dict], total: int) -> float | None:
    """Seconds the candidates still to run should take: each a long pass at the median long pass's time, or a
    guard's rejection at the median rejection's, in the shares seen so far (None before any long pass)."""
    passes = [r["seconds"] for r in rows if not r["rejected"] and "seconds" in r]
    if not passes:
        return None
    if len(rows) >= total:
        return 0.0
    rejected = [r["seconds"] for r in rows if r["rejected"] and "seconds" in r]
    share = len(passes) / (len(passes) + len(rejected))
    cost = share * float(np.median(passes)) + (1 - share) * (float(np.median(rejected)) if rejected else 0.0)
    return (total - len(rows)) * cost


OUTPUTS = ("search.json", "candidates.jsonl")   # what FactorSearch.run writes in its folder
_HELD: set[Path] = set()   # the folders whose lock this process holds


@contextlib.contextmanager
def only_search(folder: str | os.PathLike, outputs: Sequence[str] = OUTPUTS):
    """One search at a time in a folder (a second one would append the same candidates again): refused while
    another holds its lock. Once it holds it, the temporaries a killed search left of `outputs` there (a file
    written whole's `.NAME.tmp*`, a folder replaced whole's `.NAME.tmp-*` and `.NAME.old-*`) are removed: every
    search writes them under this lock, so no running one is writing them. Taken again inside (the recipe holds it
    across the search and the saving of best/), it is the same hold."""
    folder = Path(folder).resolve()
    if folder in _HELD:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:   # not POSIX: no lock, as before, and nothing removed (its writer may be running)
        yield
        return
    with open(folder / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(f"another search is running in {folder}: wait for it, or name another output "
                              f"folder") from None
        _HELD.add(folder)
        try:
            for name in outputs:
                for stale in (*folder.glob(f".{name}.tmp*"), *folder.glob(f".{name}.old-*")):
                    if stale.is_dir() and not stale.is_symlink():
                        shutil.rmtree(stale, ignore_errors=True)
                    else:
                        stale.unlink(missing_ok=True)
            yield
        finally:
            _HELD.discard(folder)


# seeds that, as a static set with their own attention factor, are their method at every length
OWN_METHODS = {"seed:YaRN": ("yarn", lambda s: 0.1 * math.log(s) + 1), "seed:llama3": ("llama3", lambda s: 1.0)}


def best_method(best: dict, target: int, original: int) -> tuple[str, dict]:
    """(method, hp.patch parameters) that saves `best` as a stock checkpoint: its own method where the best is the
    YaRN or llama3 seed of a static search with that method's attention factor (the same model, in the form more
    engines run: llama.cpp's flags take YaRN), else `longrope` with the searched factors, in the search's mode."""
    missing = [k for k in ("kind", "mode", "long_factor", "attention_factor")
               if not isinstance(best, dict) or k not in best]
    if missing:
        raise InvalidInputError(f"best must be a search's candidate (FactorSearch.run's answer, a line of "
                                f"candidates.jsonl); this one has no {', '.join(missing)}: {best!r:.80}")
    own = OWN_METHODS.get(best["kind"])
    attention = best["attention_factor"]
    if own and best["mode"] == "static" and attention is not None and \
            math.isclose(attention, own[1](target / original), rel_tol=1e-6):
        return own[0], {"max_position_embeddings": target}
    return "longrope", longrope_params(best["long_factor"], attention, best["mode"], target)


def convergence_figure(rows: Sequence[dict], path: str | os.PathLike, title: str = "") -> None:
    """Each candidate's loss (rejected ones marked above them all) and the best so far, against candidates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    accepted = [(r["index"], r["loss"]) for r in rows if not r["rejected"]]
    best, running = math.inf, []
    for r in rows:
        if not r["rejected"] and not r.get("raced_out"):
            best = min(best, r["loss"])
        running.append(best)
    whole = [(r["index"], r["loss"]) for r in rows if not r["rejected"] and not r.get("raced_out")]
    raced = [(r["index"], r["loss"]) for r in rows if not r["rejected"] and r.get("raced_out")]
    if whole:
        ax.scatter(*zip(*whole), s=14, color="tab:blue", label="candidate (CMA-ES)")
    if raced:
        ax.scatter(*zip(*raced), s=16, facecolors="none", edgecolors="tab:orange",
                   label="raced out: its first sequence's loss")
    top = max((v for _, v in accepted), default=1.0) * 1.08
    seeds = [r for r in rows if r["kind"].startswith("seed:")]
    for r in seeds:
        y = top if r["rejected"] else r["loss"]
        ax.scatter([r["index"]], [y], s=44, facecolors="none", edgecolors="tab:green")
        ax.annotate(r["kind"][5:], (r["index"], y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    if seeds:
        ax.scatter([], [], s=44, facecolors="none", edgecolors="tab:green", label="seed (closed form)")
    finite = [(i, v) for i, v in enumerate(running) if math.isfinite(v)]
    if finite:
        ax.step(*zip(*finite), where="post", color="tab:red", label="best so far")
    rejected = [r["index"] for r in rows if r["rejected"]]
    if rejected:
        ax.scatter(rejected, [top] * len(rejected), marker="x", color="grey", label="rejected by the guard (top row)")
    ax.set_xlabel("candidate")
    ax.set_ylabel("loss of far repeats (nats / token, lower is better)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))   # outside: no point hidden
    fig.tight_layout()
    with whole_file(Path(path)) as tmp:   # a kill leaves the old figure or none
        fig.savefig(tmp, dpi=110, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
