"""The searched form of LongRoPE's per-pair factors (`FactorSpace`: start, width, top, shape and optionally the
attention factor; every point a valid factor set), the closed forms a search starts from (PI, NTK, YaRN, llama3, the
ramp), the critical pair, and the stock method a best candidate saves as (`best_method`). The form and its
formula: hf_posenc/search/__init__.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .. import _compat, api
from ..config import MAX_POSITIONS, check_number
from ..errors import InvalidInputError, InvalidParameterError

SEEDS = ("linear", "ntk", "yarn", "llama3", "longrope")   # the closed forms the population starts from
SEED_NAMES = {"linear": "PI", "ntk": "NTK", "yarn": "YaRN", "llama3": "llama3", "longrope": "ramp"}
MODES = ("switched", "static")   # short factors 1 (the unpatched model inside the original context), or = long


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
