"""A longer learned table whose new rows mirror the old ones: positions 0 .. n-1 keep their rows, n .. 2n-1 read
rows n-1 .. 0, and so on back and forth."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from hf_posenc.config import Contract, Refused, register_method
from hf_posenc.methods.learned import GrownTableConfig


@register_method
@dataclass
class ReflectConfig(GrownTableConfig):
    """A longer learned table, the old rows mirrored past the end; trainable."""

    name: ClassVar[str] = "reflect"
    summary: ClassVar[str] = "a longer table, the old rows mirrored past the end; trainable"
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"factor": 0.5}, "factor must be >= 1"),),
        unchanged_within=1.0,  # the old rows stay where they were: inside the original context, the unpatched model
        reference="tests/test_examples.py::test_reflect_mirrors_the_rows",
    )

    def grow(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        n = rows.shape[0]
        index = torch.arange(length, device=rows.device) % (2 * n)
        return rows[torch.where(index < n, index, 2 * n - 1 - index)]
