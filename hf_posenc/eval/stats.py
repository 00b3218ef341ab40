"""Intervals for the cells of an evaluation: every figure a report gives carries its n and a 95 % interval.

- `wilson(k, n)`: a share of trials found (Wilson 1927's score interval: right near 0 and 1, where the
  normal interval is not, and never outside [0, 1]).
- `bootstrap_mean(values)`: a mean (a recall gap, an answer log-prob) with the percentile bootstrap interval.
- `paired_difference(a, b)`: two variants on the same probes, the mean of the per-probe differences with its
  bootstrap interval: the pairing removes what the probes share (how hard each passage is), so a difference far
  smaller than either mean's interval can be real.
- `effective_length(scores, threshold)`: RULER's effective context length (Hsieh et al. 2024): the longest length
  up to which every score stays above a threshold.

The bootstrap draws from a fixed seed, so the same values give the same interval in every run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from ..config import check_number
from ..errors import InvalidInputError, InvalidParameterError

Z95 = 1.959963984540054   # the standard normal's 97.5 % quantile
BOOTSTRAP_SAMPLES = 4000


def wilson(found: int, n: int, z: float = Z95) -> dict:
    """{"n", "found", "accuracy", "low", "high"}: the share found and its Wilson score interval."""
    if not (isinstance(n, int) and isinstance(found, int) and not isinstance(n, bool)
            and not isinstance(found, bool) and 0 <= found <= n):
        raise InvalidInputError(f"wilson needs whole counts 0 <= found <= n, got found={found!r}, n={n!r}")
    check_number("z", z, above=0, optional=False)   # a quantile's distance from the mean: negative swaps the ends
    if n == 0:
        return {"n": 0, "found": 0, "accuracy": math.nan, "low": math.nan, "high": math.nan}
    p = found / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if found == 0 else max(0.0, centre - half)      # exact at the ends, where rounding would not be
    high = 1.0 if found == n else min(1.0, centre + half)
    return {"n": n, "found": found, "accuracy": p, "low": low, "high": high}


def _values(values, name: str) -> torch.Tensor:
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise InvalidInputError(f"{name} must be a list of numbers, got {values!r:.60} ({type(values).__name__})")
    try:
        out = torch.as_tensor(list(values), dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidInputError(f"{name} must be a list of numbers, got {values!r:.60}") from None
    if out.ndim != 1:
        raise InvalidInputError(f"{name} must be a flat sequence of numbers, got shape {tuple(out.shape)}")
    if not torch.isfinite(out).all():
        raise InvalidInputError(f"{name} holds a value that is not finite: {out[~torch.isfinite(out)][:3].tolist()}")
    return out


def bootstrap_mean(values: Sequence[float], *, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> dict:
    """{"n", "mean", "low", "high", "half_width"}: the mean and its 95 % percentile-bootstrap interval. One value
    has no interval (low = high = nan); none gives a nan mean."""
    check_number("samples", samples, minimum=1, integer=True, optional=False)
    check_number("seed", seed, integer=True, optional=False)
    x = _values(values, "values")
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": math.nan, "low": math.nan, "high": math.nan, "half_width": math.nan}
    mean = x.mean().item()
    if n == 1:
        return {"n": 1, "mean": mean, "low": math.nan, "high": math.nan, "half_width": math.nan}
    generator = torch.Generator().manual_seed(seed)
    means = x[torch.randint(n, (samples, n), generator=generator)].mean(1)
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {"n": n, "mean": mean, "low": low, "high": high, "half_width": (high - low) / 2}


def paired_difference(a: Sequence[float], b: Sequence[float], **kw) -> dict:
    """a - b on the same probes (a[i] and b[i] measure probe i): `bootstrap_mean` of the differences, with
    "differs": whether the 95 % interval excludes 0 (inside it: no difference)."""
    a, b = _values(a, "a"), _values(b, "b")
    if len(a) != len(b):
        raise InvalidInputError(f"a paired difference needs the same probes on both sides, got {len(a)} and {len(b)}")
    out = bootstrap_mean((a - b).tolist(), **kw)
    out["differs"] = bool(out["n"] > 1 and (out["low"] > 0 or out["high"] < 0))
    return out


def effective_length(scores: Mapping[int, float], threshold: float) -> int | None:
    """The longest length L such that the score at L and at every shorter length measured is above `threshold`
    (RULER's effective context length; RULER's threshold is Llama-2-7B's score at 4k, 85.6 %). None when the
    shortest length is already below it."""
    check_number("threshold", threshold, above=0, optional=False)
    if threshold >= 1:   # a score is a share (found / n): a threshold of 1 or more no row can pass
        raise InvalidParameterError(f"threshold must be a share in (0, 1) (RULER's: 0.856), got {threshold!r}")
    if not isinstance(scores, Mapping) or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                              for v in scores.values()):
        raise InvalidInputError(f"scores must map each length to its score (a number), got {scores!r:.60}")
    best = None
    for length in sorted(scores):
        if not scores[length] > threshold:
            break
        best = length
    return best


def interval_text(cell: Mapping, digits: int = 2) -> str:
    """"1.85 +- 0.22 (n 48)": a bootstrap cell in one line (no interval for a single value)."""
    _cell(cell, ("n", "mean", "half_width"), "interval_text", "bootstrap_mean")
    check_number("digits", digits, minimum=0, maximum=17, integer=True, optional=False)
    if cell["n"] < 2 or math.isnan(cell["half_width"]):
        return f"{cell['mean']:.{digits}f} (n {cell['n']})"
    return f"{cell['mean']:.{digits}f} +- {cell['half_width']:.{digits}f} (n {cell['n']})"


def share_text(cell: Mapping) -> str:
    """"12/16 = 75 % [51, 90]": a Wilson cell in one line."""
    _cell(cell, ("n", "found", "accuracy", "low", "high"), "share_text", "wilson")
    if cell["n"] == 0:
        return "0 trials"
    return f"{cell['found']}/{cell['n']} = {cell['accuracy']:.0%} [{cell['low']:.0%}, {cell['high']:.0%}]"


def _cell(cell, keys: tuple[str, ...], what: str, maker: str) -> None:
    """Refuse a cell that is not what `maker` gives, naming the keys it lacks."""
    missing = [k for k in keys if k not in cell] if isinstance(cell, Mapping) else list(keys)
    if missing:
        raise InvalidInputError(f"{what} needs a cell of {maker} ({', '.join(keys)}); {cell!r:.60} lacks "
                                f"{', '.join(missing)}")


def check_rows(rows, keys: set[str], summary: str, scorer: str) -> None:
    """`rows` as `scorer` returns them (a non-empty list of mappings, each with `keys`) before `summary` reads
    them; refused naming the first row that is not one."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise InvalidInputError(f"{summary} needs the rows of {scorer}, got {rows!r:.60}")
    for i, row in enumerate(rows):
        missing = keys - set(row) if isinstance(row, dict) else keys
        if missing:
            raise InvalidInputError(f"rows[{i}] is not a row of {scorer}: it lacks {', '.join(sorted(missing))}")
