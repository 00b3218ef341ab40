"""The model's positions removed, and one learned slope per head and layer times the distance on the scores
(ALiBi's bias, Press et al. 2022, with slopes that train from 0)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hf_posenc.attention import AttentionMethodConfig, AttentionSite, PositionalAttention, ScoreBias, distances
from hf_posenc.config import Contract, Refused, register_method


class SlopeBias(ScoreBias):
    """-slope_h * |i - j| for every head h, [heads, queries, keys]."""

    same_in_every_layer: ClassVar[bool] = False  # one learned set of slopes per layer

    def __init__(self, heads: int, reference: torch.Tensor):
        super().__init__()
        self.slopes = nn.Parameter(reference.new_zeros(heads))  # the model's device and dtype

    def forward(self, first_query: int, queries: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
        distance = distances(first_query, queries, keys, self.slopes.device).abs()
        return (-self.slopes[:, None, None] * distance).to(dtype)


@register_method
@dataclass
class LinearBiasConfig(AttentionMethodConfig):
    """Positions removed; head h adds -slope_h * |i - j| to the score of query i and key j, slope_h learned."""

    name: ClassVar[str] = "linear_bias"
    mechanisms: ClassVar[tuple[str, ...]] = ("learned", "rope")
    summary: ClassVar[str] = "positions removed, a learned slope per head times the distance"
    adds_bias: ClassVar[bool] = True
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"factor": 0.5}, "factor must be >= 1"),),
        reference="tests/test_examples.py::test_linear_bias_is_minus_slope_times_distance",
    )

    def attention_child(self, site: AttentionSite, module: nn.Module) -> nn.Module:
        bias = SlopeBias(site.heads, site.reference)
        return PositionalAttention(causal=module.is_causal, bias=bias, layout=site.layout)
