"""ALiBi (Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation"): the model's positions removed, a fixed linear distance penalty per head on the scores
(the bias itself: hf_posenc/methods/bias.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from ..attention import AttentionMethodConfig, AttentionSite, PositionalAttention
from ..config import Contract, Refused, register_method
from .bias import AlibiBias


@register_method
@dataclass
class AlibiConfig(AttentionMethodConfig):
    """ALiBi (Press et al. 2022): the model's positions are removed and each head h adds -m_h * (i - j)
    to the score of query i and key j, with the paper's geometric slopes m_h. Encoders (bidirectional
    attention) get -m_h * |i - j|."""

    name: ClassVar[str] = "alibi"
    mechanisms: ClassVar[tuple[str, ...]] = ("learned", "rope")
    summary: ClassVar[str] = "ALiBi: positions removed, a fixed linear distance penalty per head on the scores"
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"factor": 0.5}, "factor must be >= 1"),
                 Refused({"max_position_embeddings": 1.5}, "max_position_embeddings must be an int")),
        reference="tests/test_attention_methods.py::test_alibi_bias_given_to_sdpa_is_minus_slope_times_distance",
    )
    adds_bias: ClassVar[bool] = True

    def attention_child(self, site: AttentionSite, module: nn.Module) -> nn.Module:
        # the same in every layer: one child for all of them, which builds the bias once a forward
        if "alibi" not in site.shared:
            bias = AlibiBias(site.heads, bidirectional=not site.causal)
            site.shared["alibi"] = PositionalAttention(causal=site.causal, bias=bias, layout=site.layout)
        return site.shared["alibi"]
