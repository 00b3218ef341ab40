"""A learned relative-position bias on the attention scores (Shaw et al. 2018, "Self-Attention with Relative
Position Representations": a value per head for each clipped distance; or T5's log-spaced buckets, Raffel et
al. 2020). The table itself: hf_posenc/methods/bias.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from ..attention import AttentionMethodConfig, AttentionSite, PositionalAttention
from ..config import Contract, MAX_POSITIONS, Refused, check_number, register_method
from ..errors import InvalidParameterError
from .bias import RelativeBias


@register_method
@dataclass
class RelativeBiasConfig(AttentionMethodConfig):
    """A learned bias per head and layer for each relative position j - i, clipped to [-k, k] (2k + 1
    values per head), or T5's log buckets (`buckets=` values per head, distances up to `max_distance`
    on a log scale). Initialised to zero: the model starts as itself without positions."""

    name: ClassVar[str] = "relative_bias"
    mechanisms: ClassVar[tuple[str, ...]] = ("learned", "rope")
    summary: ClassVar[str] = "learned per-head bias per clipped distance [-k, k] (or T5 log buckets), starts at 0"
    contract: ClassVar[Contract] = Contract(
        examples=({"k": 8}, {"buckets": 16, "max_distance": 64}),
        refused=(Refused({"k": 0}, "k must be > 0"), Refused({"buckets": 32}, "need both buckets= and max_distance=")),
        reference="tests/test_attention_methods.py::test_t5_buckets_match_transformers_t5",
    )
    adds_bias: ClassVar[bool] = True

    k: int = 128
    buckets: int | None = None
    max_distance: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("k", self.k, above=0, maximum=MAX_POSITIONS, integer=True, optional=False)
        check_number("buckets", self.buckets, minimum=4, maximum=MAX_POSITIONS, integer=True)
        check_number("max_distance", self.max_distance, above=0, maximum=MAX_POSITIONS, integer=True)
        if (self.buckets is None) != (self.max_distance is None):
            raise InvalidParameterError(
                f"T5 buckets need both buckets= and max_distance= (got buckets={self.buckets!r}, "
                f"max_distance={self.max_distance!r}); give neither for the clipped table of k={self.k}"
            )
        if self.buckets is not None and self.max_distance <= self.buckets // 2:
            raise InvalidParameterError(
                f"max_distance={self.max_distance} must be > buckets // 2 = {self.buckets // 2} (the distances that "
                f"get a bucket each); the log-spaced buckets cover the distances between"
            )

    def attention_child(self, site: AttentionSite, module: nn.Module) -> nn.Module:
        bias = RelativeBias(site.heads, k=self.k, buckets=self.buckets, max_distance=self.max_distance,
                            bidirectional=not module.is_causal, dtype=site.reference.dtype,
                            device=site.reference.device)
        return PositionalAttention(causal=module.is_causal, bias=bias, layout=site.layout)
