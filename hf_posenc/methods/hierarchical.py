"""Hierarchical decomposition of a learned position table (Su 2020, "Hierarchically decomposed position
encoding", the method used to extend BERT's 512 positions).

With the n learned rows p_0 .. p_{n-1} and a in (0, 1), the bases u_i = (p_i - a p_0) / (1 - a); position
k = i n + j (i = k // n, j = k mod n) gets

    q_k = a u_i + (1 - a) u_j,

so a table of n rows serves n^2 positions. For k < n (i = 0): u_0 = p_0, so q_k = a p_0 + (p_j - a p_0) = p_j,
the original rows; they are copied, bit for bit. Past them, position i n + j is the original row j moved by
a (u_i - u_0): each block of n positions repeats the learned pattern, offset by its block index's row. a = 0.5
would make (i, j) and (j, i) the same position (a u_i + (1 - a) u_j is then symmetric), so it is refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import Contract, Refused, check_number, register_method
from ..errors import InvalidParameterError
from .learned import GrownTableConfig


def hierarchical_rows(rows: torch.Tensor, length: int, alpha: float) -> torch.Tensor:
    """`length` rows (at most n^2) from the n learned `rows`: the first n copied, row i n + j past them
    alpha u_i + (1 - alpha) u_j with u = (rows - alpha rows[0]) / (1 - alpha), computed in float64."""
    n = rows.shape[0]
    if length > n * n:
        raise InvalidParameterError(f"hierarchical positions reach n^2 = {n * n} from a table of {n} rows; "
                                    f"{length} asked")
    source = rows.double()
    bases = (source - alpha * source[0]) / (1 - alpha)
    k = torch.arange(n, length, device=rows.device)
    grown = alpha * bases[k // n] + (1 - alpha) * bases[k % n]
    return torch.cat([rows[:length].clone(), grown.to(rows.dtype)])


@register_method
@dataclass
class HierarchicalConfig(GrownTableConfig):
    """A longer learned table by hierarchical decomposition (Su 2020): position i n + j of a table of n rows
    is alpha u_i + (1 - alpha) u_j, u_i = (p_i - alpha p_0) / (1 - alpha); the first n positions are the
    original rows exactly, up to n^2 positions. Trainable afterwards."""

    name: ClassVar[str] = "hierarchical"
    summary: ClassVar[str] = "longer learned table, position i*n+j = a u_i + (1-a) u_j (Su 2020), up to n^2 (trainable)"
    contract: ClassVar[Contract] = Contract(
        examples=({}, {"alpha": 0.1}),
        refused=(Refused({"factor": 2, "alpha": 0.5}, "alpha=0.5 makes position"),
                 Refused({"factor": 1000}, "hierarchical positions reach n^2")),
        unchanged_within=1.0,
        reference="tests/test_hierarchical.py::test_rows_follow_the_formula_and_keep_the_first_n_exactly",
    )

    alpha: float = 0.4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("alpha", self.alpha, above=0, optional=False)
        if not self.alpha < 1:
            raise InvalidParameterError(f"alpha must be in (0, 1) (u_i divides by 1 - alpha), got {self.alpha!r}")
        if self.alpha == 0.5:
            raise InvalidParameterError(
                "alpha=0.5 makes position i*n+j equal to position j*n+i (0.5 u_i + 0.5 u_j is symmetric); "
                "use another value in (0, 1), e.g. the default 0.4")

    def resolve(self, original: int) -> HierarchicalConfig:
        resolved = super().resolve(original)
        if resolved.max_position_embeddings > original ** 2:
            raise InvalidParameterError(
                f"max_position_embeddings={resolved.max_position_embeddings}: hierarchical positions reach n^2 = "
                f"{original ** 2} from this {original}-position table; it must be <= {original ** 2}")
        return dataclasses.replace(resolved)

    def grow(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        return hierarchical_rows(rows, length, self.alpha)
