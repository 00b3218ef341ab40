"""Two checks of the properties the papers state (Vaswani et al. 2017, Su et al. 2021), as numbers:

- `check_relative`: how far the q.k scores a positional mechanism gives depend on the absolute positions
  m and n rather than only on m - n. RoPE: <R_m q, R_n k> = <q, R_(n-m) k>, so 0 (up to the float32
  angles transformers computes). A sinusoidal table: PE(m).PE(n) = sum_i cos((m - n) w_i), so 0 too.
  A learned table: nothing ties PE(m).PE(n) to m - n, so far from 0.
- `check_rotation`: how far PE(pos + k) is from a rotation of PE(pos) in each frequency pair (2i, 2i+1),
  with one angle per pair and shift, the same for every pos. Sinusoidal: exactly a rotation by k * w_i,
  so 0 up to float error; learned: far from 0.

Both return a relative residual: 0 when the property holds, of order 1 when nothing of it does."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from ..errors import InvalidParameterError, MethodNotApplicableError
from ..methods.sinusoidal import SinusoidalPositions
from ..registry import find_family
from . import _model
from ._model import position_table
from .rope import _rotary, rotary_cos_sin

DEFAULT_LENGTH = 512


def toeplitz_residual(scores: torch.Tensor) -> float:
    """||S - T(S)|| / ||S|| (Frobenius), T(S) the matrix whose every diagonal n - m = const holds that
    diagonal's mean: the part of S that is not a function of n - m alone."""
    scores = torch.as_tensor(scores, dtype=torch.float64)
    rows, cols = scores.shape
    offset = (torch.arange(cols)[None, :] - torch.arange(rows)[:, None] + rows - 1).reshape(-1)
    sums = torch.bincount(offset, weights=scores.reshape(-1), minlength=rows + cols - 1)
    counts = torch.bincount(offset, minlength=rows + cols - 1).to(torch.float64)
    toeplitz = (sums / counts)[offset].reshape(rows, cols)
    return float((scores - toeplitz).norm() / scores.norm().clamp_min(1e-300))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (d,) rotated at every position: (positions, d). The pairing follows the layout of cos: halves
    (cos = [c, c], transformers' rotate_half) or interleaved (cos = [c0, c0, c1, c1, ...], GPT-J style)."""
    half = cos.shape[-1] // 2
    if torch.allclose(cos[:, :half], cos[:, half:]) and torch.allclose(sin[:, :half], sin[:, half:]):
        turned = torch.cat([-x[half:], x[:half]])
    elif torch.allclose(cos[:, 0::2], cos[:, 1::2]) and torch.allclose(sin[:, 0::2], sin[:, 1::2]):
        turned = torch.stack([-x[1::2], x[0::2]], dim=-1).reshape(-1)
    else:
        raise MethodNotApplicableError("the rotary module's cos/sin are neither in halves nor interleaved")
    return x * cos + turned * sin


def _rope_scores(module: nn.Module, layer_type, length: int, trials: int, seed: int) -> list[torch.Tensor]:
    cos, sin = rotary_cos_sin(module, torch.arange(length), layer_type)
    generator = torch.Generator().manual_seed(seed)
    scores = []
    for _ in range(trials):
        q, k = torch.randn(2, cos.shape[-1], generator=generator, dtype=torch.float64)
        scores.append(_rotate(q, cos, sin) @ _rotate(k, cos, sin).T)  # [m, n] = <R_m q, R_n k>
    return scores


def _module_table(module: nn.Module, length: int | None) -> torch.Tensor:
    offset = int(getattr(module, "offset", 0))
    if isinstance(module, SinusoidalPositions):
        return module.table(offset + (length or module.rows - offset))[offset:].to("cpu", torch.float64)
    if isinstance(module, nn.Embedding):
        return module.weight.detach()[offset:].to("cpu", torch.float64)
    raise TypeError(f"not a position table module: {type(module).__name__}")


def check_relative(source, *, length: int | None = None, trials: int = 8, seed: int = 0) -> float:
    """How far the q.k scores of a positional mechanism depend on absolute positions rather than only
    on m - n, over positions 0..length-1 (default: the context, at most 512): the Toeplitz residual of
    the score matrix S[m, n] (see `toeplitz_residual`), 0 when S depends on m - n alone.

    `source`: a model (RoPE or a position table, patched or not), a rotary module, a position-table
    module, or a 2-D table tensor. RoPE: S[m, n] = <R_m q, R_n k> with the module's own cos/sin, for
    `trials` random pairs q, k (the residuals pooled). A table: S[m, n] = PE(m) . PE(n), the
    position-position term of the attention score of an absolute encoding (the decay with distance)."""
    if length is not None and length < 2:
        raise InvalidParameterError(f"length must be >= 2, got {length!r}")
    module, layer_type, table = None, None, None
    if isinstance(source, torch.Tensor):
        table = source
    elif isinstance(source, PreTrainedModel):
        family = find_family(source)
        if family.mechanism == "rope":
            module, layer_type = _rotary(source)
            length = length or min(_model.contexts(source)[1], DEFAULT_LENGTH)
        else:
            table = position_table(source, length or min(family.positions(source), DEFAULT_LENGTH))
    elif _is_rotary(source):
        module = source
        layer_type = next(iter(getattr(source, "layer_types", [None]) or [None]))
        context = getattr(source, "original_max_seq_len", None) or DEFAULT_LENGTH
        length = length or min(int(context), DEFAULT_LENGTH)
    elif isinstance(source, nn.Module):
        table = _module_table(source, length)
    else:
        raise TypeError(f"check_relative takes a model, a rotary or position-table module, or a 2-D tensor, "
                        f"got {type(source).__name__}")
    if module is not None:
        scores = _rope_scores(module, layer_type, int(length), trials, seed)
    else:
        table = torch.as_tensor(table, dtype=torch.float64)
        if table.ndim != 2:
            raise InvalidParameterError(f"a position table is 2-D (positions, dim), got shape {tuple(table.shape)}")
        table = table[: length or DEFAULT_LENGTH]
        scores = [table @ table.T]
    residual = sum(toeplitz_residual(s) ** 2 * float(s.norm()) ** 2 for s in scores)
    return math.sqrt(residual / max(sum(float(s.norm()) ** 2 for s in scores), 1e-300))


def _is_rotary(module) -> bool:
    return isinstance(module, nn.Module) and any(name.endswith("inv_freq")
                                                 for name, _ in module.named_buffers(recurse=False))


@dataclass
class RotationFit:
    """PE(pos + shift) against R(angle_i) PE(pos) in each pair i, R(a) = [[cos a, sin a], [-sin a, cos a]]
    (the rotation property: sin(x + a), cos(x + a) from sin x, cos x): the best angle per pair (least
    squares over pos), and per pair the residual ||PE(pos + shift) - R PE(pos)|| and the norm
    ||PE(pos + shift)|| over pos."""

    shift: int
    angles: torch.Tensor
    residuals: torch.Tensor
    norms: torch.Tensor

    @property
    def relative_residual(self) -> float:
        return float(self.residuals.norm() / self.norms.norm().clamp_min(1e-300))


def rotation_fit(table: torch.Tensor, shift: int) -> RotationFit:
    """The best rotation per pair (2i, 2i+1) that maps the rows pos to the rows pos + shift (an odd last
    column has no pair and is left out). 2-D orthogonal Procrustes: the angle a maximising
    sum_pos y . R(a) x is atan2(sum y0 x1 - y1 x0, sum x . y)."""
    table = torch.as_tensor(table, dtype=torch.float64)
    if table.ndim != 2 or table.shape[1] < 2:
        raise InvalidParameterError(f"a position table is 2-D (positions, dim >= 2), got shape {tuple(table.shape)}")
    if not 0 < shift < len(table):
        raise InvalidParameterError(f"shift must be in 1..{len(table) - 1} for a table of {len(table)} rows, "
                                    f"got {shift!r}")
    pairs = table.shape[1] // 2
    x = table[:-shift, : 2 * pairs].reshape(-1, pairs, 2)
    y = table[shift:, : 2 * pairs].reshape(-1, pairs, 2)
    dot = (x * y).sum((0, 2))
    cross = (y[..., 0] * x[..., 1] - y[..., 1] * x[..., 0]).sum(0)
    angles = torch.atan2(cross, dot)
    c, s = torch.cos(angles), torch.sin(angles)
    rotated = torch.stack([c * x[..., 0] + s * x[..., 1], -s * x[..., 0] + c * x[..., 1]], dim=-1)
    residuals = (y - rotated).pow(2).sum((0, 2)).sqrt()
    return RotationFit(shift=shift, angles=angles, residuals=residuals, norms=y.pow(2).sum((0, 2)).sqrt())


def check_rotation(table, shifts: Sequence[int] | None = None) -> float:
    """How far PE(pos + k) is from a rotation of PE(pos) in every frequency pair (2i, 2i+1), pooled over
    the shifts k (default 1, 2, 4, ... up to half the table): sqrt(sum of squared residuals / sum of
    squared norms) of `rotation_fit`. 0 for the sinusoidal table (up to float error); of order 1 for a
    learned one. `table`: a 2-D tensor (positions, dim), a position-table module, or a learned-position
    model (its table now, patched or not)."""
    if isinstance(table, PreTrainedModel):
        table = position_table(table)
    elif isinstance(table, nn.Module):
        table = _module_table(table, None)
    table = torch.as_tensor(table, dtype=torch.float64)
    if shifts is None:
        shifts = [2 ** j for j in range(max(1, int(math.log2(max(len(table) // 2, 1))) + 1))]
    fits = [rotation_fit(table, int(k)) for k in shifts]
    residual = sum(float(f.residuals.pow(2).sum()) for f in fits)
    norm = sum(float(f.norms.pow(2).sum()) for f in fits)
    return math.sqrt(residual / max(norm, 1e-300))


__all__ = ["check_relative", "check_rotation", "rotation_fit", "RotationFit", "toeplitz_residual"]
