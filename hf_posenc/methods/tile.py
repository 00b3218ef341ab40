"""A longer learned table made of copies of the old one (Beltagy et al. 2020, "Longformer": how it
initialised its 4096-position table from RoBERTa's 512)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import Contract, Refused, register_method
from .learned import GrownTableConfig


def tile_rows(rows: torch.Tensor, length: int) -> torch.Tensor:
    """`length` rows: row p is rows[p mod n] (Longformer's initialisation of a longer table)."""
    return rows[torch.arange(length, device=rows.device) % rows.shape[0]].clone()


@register_method
@dataclass
class TileConfig(GrownTableConfig):
    """A longer learned table made of copies of the old rows, p -> p mod N_old (Longformer's
    initialisation). Trainable afterwards."""

    name: ClassVar[str] = "tile"
    summary: ClassVar[str] = "longer learned table, the old rows repeated (Longformer's init; trainable)"
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"factor": 2, "window": 3}, "unknown parameter(s) ['window']"),),
        unchanged_within=1.0,
        reference="tests/test_sinusoidal.py::test_tiling_repeats_the_rows",
    )

    def grow(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        return tile_rows(rows, length)
