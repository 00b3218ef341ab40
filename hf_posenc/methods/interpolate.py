"""A longer learned table by linear interpolation of the old one (position interpolation for learned tables,
as Chen et al. 2023 do for RoPE): the new table spans the old one at a finer step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import Contract, Refused, register_method
from .learned import GrownTableConfig


def interpolate_rows(rows: torch.Tensor, length: int) -> torch.Tensor:
    """`length` rows; row p reads `rows` at x = p * (n - 1) / (length - 1), linearly between the two
    neighbours of x. Integer x (every row when length == n) copies a row exactly."""
    n = rows.shape[0]
    if n == 1:
        return rows[torch.zeros(length, dtype=torch.long, device=rows.device)]
    source = rows.double()
    x = torch.arange(length, dtype=torch.float64, device=rows.device) * (n - 1) / (length - 1)
    low = x.floor().long().clamp(max=n - 2)  # the last row is reached with frac == 1
    frac = (x - low).unsqueeze(1)
    return (source[low] * (1 - frac) + source[low + 1] * frac).to(rows.dtype)


@register_method
@dataclass
class InterpolateConfig(GrownTableConfig):
    """A longer learned table by linear interpolation: position p of the new table reads the old one at
    p * (N_old - 1) / (N_new - 1). Trainable afterwards."""

    name: ClassVar[str] = "interpolate"
    summary: ClassVar[str] = "longer learned table, linearly interpolated from the old one (trainable)"
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"factor": 0}, "factor must be > 0"), Refused({}, "needs max_position_embeddings=")),
        reference="tests/test_sinusoidal.py::test_interpolation_reads_the_old_table_at_the_scaled_position",
    )

    def grow(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        return interpolate_rows(rows, length)
