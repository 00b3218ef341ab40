"""YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models"):
NTK-by-parts interpolation (dimensions whose wavelength fits many times in the original context are kept,
those longer than it are interpolated by s, a linear ramp between, set by beta_fast / beta_slow) and an
attention temperature sqrt(1/t) = 0.1 ln s + 1 on cos and sin."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..config import Contract, Refused, RopeMethodConfig, check_bool, check_number, register_method
from ..errors import InvalidParameterError, MethodNotApplicableError
from .rope import optional_fields


def check_betas(beta_fast: float, beta_slow: float) -> None:
    check_number("beta_fast", beta_fast, above=0, optional=False)
    check_number("beta_slow", beta_slow, above=0, optional=False)
    if beta_fast <= beta_slow:
        raise InvalidParameterError(
            f"beta_fast must be > beta_slow (rotations that mark the extrapolated and the interpolated "
            f"dimensions), got beta_fast={beta_fast!r}, beta_slow={beta_slow!r}"
        )


def check_yarn_fields(method) -> None:
    """The checks of the fields YaRN and dynamic YaRN share."""
    check_betas(method.beta_fast, method.beta_slow)
    check_number("mscale", method.mscale, above=0)
    check_number("mscale_all_dim", method.mscale_all_dim, above=0)
    check_bool("truncate", method.truncate)


def check_truncate_layer_types(method, config, layer_types: list[str | None]) -> None:
    """truncate=False on a model with one RoPE per layer type cannot be written: transformers' yarn reads
    `truncate` from the top of rope_parameters, never from a layer type's dict."""
    if layer_types != [None] and method.truncate is False:
        raise MethodNotApplicableError(
            f"truncate=False cannot be expressed for this {config.model_type} model's per-layer-type RoPE "
            f"({layer_types}): transformers ignores it there; leave truncate=True")


def default_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature sqrt(1/t) = 0.1 mscale ln s + 1 (1 at s <= 1), as the paper, transformers, vLLM and
    llama.cpp compute it."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(method, factor: float) -> float:
    """The scale transformers puts on cos and sin for YaRN's fields at `factor`: attention_factor where given, else
    the ratio of the two mscales where both are given (DeepSeek's form), else the default."""
    if getattr(method, "attention_factor", None) is not None:   # dynamic YaRN has none
        return float(method.attention_factor)
    if method.mscale and method.mscale_all_dim:
        return default_attention_factor(factor, method.mscale) / default_attention_factor(factor, method.mscale_all_dim)
    return default_attention_factor(factor)


def yarn_parameters(method, base: dict, original: int, factor: float, optional: tuple[str, ...]) -> dict:
    """transformers' "yarn" rope_parameters at `factor`, from the fields of `method` (YaRN or dynamic YaRN);
    `optional`: the fields written only when set. A scale other than the default is also written as `attn_factor`,
    the multiplier on 0.1 ln s + 1 that vLLM reads (it reads neither attention_factor nor the mscales)."""
    out = base | {
        "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
        "beta_fast": method.beta_fast, "beta_slow": method.beta_slow, "truncate": method.truncate,
    } | optional_fields(method, *optional)
    scale = yarn_attention_factor(method, factor)
    if not math.isclose(scale, default_attention_factor(factor), rel_tol=1e-9):
        out["attn_factor"] = scale / default_attention_factor(factor)
    return out


@register_method
@dataclass
class YarnConfig(RopeMethodConfig):
    """YaRN (Peng et al. 2023): NTK-by-parts interpolation plus an attention temperature
    (attention_factor, default 0.1 ln s + 1, or from mscale / mscale_all_dim)."""

    name: ClassVar[str] = "yarn"
    summary: ClassVar[str] = "YaRN: per-dimension interpolation ramp + attention factor"
    contract: ClassVar[Contract] = Contract(
        examples=({}, {"beta_fast": 16.0, "attention_factor": 1.2, "truncate": False}),
        refused=(Refused({"factor": 2, "beta_fast": 1, "beta_slow": 2}, "beta_fast must be > beta_slow"),
                 Refused({"factor": 2, "truncate": "yes"}, "truncate must be a bool")),
        reference="tests/test_rope_families.py::test_rotary_matches_transformers_and_the_paper_formula",
        expected_rope_parameters=lambda theta, dim, original: {
            "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": original},
    )
    stock_checkpoint: ClassVar[bool] = True

    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_yarn_fields(self)
        check_number("attention_factor", self.attention_factor, above=0)

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return yarn_parameters(self, base, original, self.factor, ("attention_factor", "mscale", "mscale_all_dim"))

    def check_layer_types(self, config, layer_types: list[str | None]) -> None:
        check_truncate_layer_types(self, config, layer_types)
