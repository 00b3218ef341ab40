"""Position as a bias on the attention scores: ALiBi and the learned relative-position table.

Scores become q_i . k_j / sqrt(d) + b_h(i - j) for head h, query position i, key position j:
- ALiBi (Press et al. 2022): b_h(i - j) = -m_h * (i - j), a fixed slope m_h per head, so attention
  fades linearly with distance ("train short, test long").
- relative bias (Shaw et al. 2018, the clipped table): b_h = a learned value per head for
  each distance j - i clipped to [-k, k] (2k + 1 values per head); or, as in T5, one value per
  log-spaced bucket of distances up to `max_distance`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from ..attention import Block, ScoreBias, distances


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes: for n a power of two, the geometric sequence 2^(-8/n), 2^(-16/n), ...,
    2^(-8). Otherwise the slopes of the closest power of two below n, then every other slope of twice
    that power, until there are n."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    power = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(power)
    if power < num_heads:
        slopes += geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=torch.float64)


def clipped_index(relative: torch.Tensor, k: int) -> torch.Tensor:
    """Row of the (2k + 1)-row table for relative position j - i: clipped to [-k, k], then shifted to 0..2k."""
    return relative.clamp(-k, k) + k


def bucket_index(relative: torch.Tensor, buckets: int, max_distance: int, bidirectional: bool) -> torch.Tensor:
    """T5's log buckets of relative position j - i: half the buckets (per direction when bidirectional)
    hold one exact distance each, the other half cover distances up to `max_distance` on a log scale;
    longer distances share the last bucket."""
    offset = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        offset = (relative > 0).long() * buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # keys ahead of the query never count in a causal model
    exact = buckets // 2
    log_scaled = exact + (
        torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (buckets - exact)
    ).long()
    log_scaled = log_scaled.clamp(max=buckets - 1)
    return offset + torch.where(distance < exact, distance, log_scaled)


class AlibiBias(ScoreBias):
    """-slope_h * (i - j) for every head h, [heads, queries, keys] (the causal mask removes keys after the
    query); -slope_h * |i - j| for bidirectional attention (encoders). One module serves every layer;
    the slopes are fixed."""

    same_in_every_layer: ClassVar[bool] = True

    def __init__(self, num_heads: int, bidirectional: bool = False):
        super().__init__()
        self.num_heads, self.bidirectional = num_heads, bidirectional
        self.register_buffer("slopes", alibi_slopes(num_heads).float(), persistent=False)

    def forward(self, first_query: int, queries: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
        distance = distances(first_query, queries, keys, self.slopes.device)
        if self.bidirectional:
            distance = distance.abs()
        return (-self.slopes[:, None, None] * distance).to(dtype)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, bidirectional={self.bidirectional}"


class RelativeBias(ScoreBias):
    """A learned bias per head for each relative position (clipped to [-k, k], or T5 buckets),
    [heads, queries, keys]. Starts at zero: the patched model starts as the model without positions."""

    def __init__(self, num_heads: int, *, k: int | None = None, buckets: int | None = None,
                 max_distance: int | None = None, bidirectional: bool = False,
                 dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.num_heads, self.k, self.buckets, self.max_distance = num_heads, k, buckets, max_distance
        self.bidirectional = bidirectional
        rows = buckets if buckets is not None else 2 * k + 1
        self.table = nn.Parameter(torch.zeros(num_heads, rows, dtype=dtype, device=device))

    def index(self, first_query: int, queries: int, keys: int) -> torch.Tensor:
        relative = -distances(first_query, queries, keys, self.table.device)  # j - i
        if self.buckets is not None:
            return bucket_index(relative, self.buckets, self.max_distance, self.bidirectional)
        return clipped_index(relative, self.k)

    def forward(self, first_query: int, queries: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
        return self.gather(self.index(first_query, queries, keys), dtype)

    def block_bias(self, block: Block, dtype: torch.dtype) -> torch.Tensor:
        # every layer's table of a model reads the same rows: computed once a forward, the masked places (a bool
        # mask) set to the row past the table, which reads the dtype's minimum
        key = ("relative rows", self.k, self.buckets, self.max_distance, self.bidirectional, self.table.shape[1])
        rows = block.memo.get(key)
        if rows is None:
            rows = self.index(block.first, block.end - block.start, block.keys)
            if block.allowed is not None and block.allowed.dtype == torch.bool:  # [batch | 1, queries, keys]
                rows = torch.where(block.allowed[:, 0], rows, self.table.shape[1])
            block.memo[key] = rows
        bias = self.gather(rows, dtype)
        return bias.transpose(0, 1) if bias.dim() == 4 else bias[None]

    def gather(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The table's values at `index` (rows, any shape), [heads, *index.shape]. Row `len(rows)`, one past
        the table, reads the dtype's minimum: an index with the masked places set to it gives the bias
        and the mask in one gather (one pass over heads x queries x keys, not three)."""
        table = self.table.to(dtype)
        table = torch.cat([table, table.new_full((self.num_heads, 1), torch.finfo(dtype).min)], dim=1)
        return table.index_select(1, index.flatten()).view(self.num_heads, *index.shape)

    def extra_repr(self) -> str:
        if self.buckets is not None:
            return (f"num_heads={self.num_heads}, buckets={self.buckets}, max_distance={self.max_distance}, "
                    f"bidirectional={self.bidirectional}")
        return f"num_heads={self.num_heads}, k={self.k}"
