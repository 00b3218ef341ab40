"""One dataclass per method. Each validates its own fields in `__post_init__`, so a bad value is
refused before the model is touched; `resolve(original)` then fills the target context and the
factor from each other once the model's original context is known."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import InvalidParameterError, ParameterTypeError


# The longest context a parameter may name: 2^31 - 1 positions (int32 position ids; float32 angles are
# already inexact past 2^24). Larger values are typos (factor=1e30), refused before they overflow.
MAX_POSITIONS = 2**31 - 1


def plain(name: str, value: Any) -> Any:
    """`value` as plain Python: numpy and torch scalars become numbers, their arrays (nested) lists, and
    lists and tuples keep their kind with plain items, so a validated parameter always fits in the JSON
    of a saved config.json. Anything else is returned as it is, for the checks to refuse."""
    if type(value) in (bool, int, float, str) or value is None:
        return value
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy / torch scalars and arrays
        try:
            return value.tolist()
        except Exception as err:  # a meta tensor, ...
            raise ParameterTypeError(
                f"{name} must be a number or a list of numbers, got {value!r} ({type(value).__name__}): {err}"
            ) from None
    if isinstance(value, (list, tuple)):
        return type(value)(plain(f"{name}[{i}]", v) for i, v in enumerate(value))
    return value


def check_number(name: str, value: Any, *, minimum: float | None = None, above: float | None = None,
                 maximum: float | None = None, integer: bool = False, optional: bool = True) -> None:
    """Refuse bools, strings, NaN and inf; enforce `value >= minimum` or `value > above`, `value <= maximum`."""
    if value is None:
        if optional:
            return
        raise InvalidParameterError(f"{name} is required")
    kind = "an int" if integer else "a number"
    allowed = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed):
        # numpy / torch scalars are fine when they hold a plain number
        if not isinstance(value, bool) and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            return check_number(name, value.item(), minimum=minimum, above=above, maximum=maximum, integer=integer,
                                optional=optional)
        raise ParameterTypeError(f"{name} must be {kind}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise InvalidParameterError(f"{name} must be finite, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidParameterError(f"{name} must be >= {minimum}, got {value!r}")
    if above is not None and value <= above:
        raise InvalidParameterError(f"{name} must be > {above}, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidParameterError(f"{name} must be <= {maximum}, got {value!r}")


def parse_params(pairs: list[str]) -> dict:
    """["beta_fast=16", "long_factor=[1,2]"] -> {"beta_fast": 16, "long_factor": [1, 2]}: values are JSON
    when they parse (numbers, lists, true/false/null), else strings. For command lines and configs."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidParameterError(f"parameters are key=value, got {pair!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


@dataclass
class MethodConfig:
    """Fields every method shares: the target context, or the factor over the original one."""

    name: ClassVar[str]
    mechanisms: ClassVar[tuple[str, ...]]
    summary: ClassVar[str] = ""
    # True when positions of a token depend on the length of the whole input (dynamic scaling):
    # a one-pass evaluation or cached generation is not the same as separate forwards.
    length_dependent: ClassVar[bool] = False

    max_position_embeddings: int | None = None
    factor: float | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # numpy / torch values as plain Python, before any check
            setattr(self, f.name, plain(f.name, getattr(self, f.name)))
        check_number("max_position_embeddings", self.max_position_embeddings, above=0, maximum=MAX_POSITIONS,
                     integer=True)
        check_number("factor", self.factor, above=0)

    def resolve(self, original: int) -> MethodConfig:
        """A copy with `factor` and `max_position_embeddings` both set, checked against `original`."""
        factor, target = self.factor, self.max_position_embeddings
        if factor is None and target is None:
            raise InvalidParameterError(
                f"method {self.name!r} needs max_position_embeddings= (the target context, >= the original "
                f"{original}) or factor= (>= 1)"
            )
        if factor is not None and factor < 1:
            raise InvalidParameterError(
                f"factor must be >= 1 (a target context at least the original {original}), got {factor!r}"
            )
        if target is not None and target < original:
            raise InvalidParameterError(
                f"max_position_embeddings={target} is shorter than the model's original context {original}; "
                f"it must be >= {original}"
            )
        if factor is None:
            factor = target / original
        elif target is None:
            if original * factor > MAX_POSITIONS:
                raise InvalidParameterError(
                    f"factor={factor!r} means a context of {original * factor:.3g} tokens (the original {original} "
                    f"times the factor); it must be <= {MAX_POSITIONS}, so factor <= {MAX_POSITIONS / original:.6g}"
                )
            target = round(original * factor)
        elif round(original * factor) != target:
            raise InvalidParameterError(
                f"factor={factor!r} and max_position_embeddings={target} disagree: the original context is "
                f"{original}, so factor={factor!r} means {round(original * factor)}; give one of them, or "
                f"factor={target / original:g}"
            )
        return dataclasses.replace(self, factor=float(factor), max_position_embeddings=int(target))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MethodConfig:
        if not isinstance(data, dict):
            raise ParameterTypeError(f"the parameters of method {cls.name!r} must be a dict, got {data!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InvalidParameterError(
                f"unknown parameter(s) {unknown} for method {cls.name!r}; allowed: {sorted(names)}"
            )
        return cls(**data)

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """Each parameter with its default, for `hf-posenc methods`."""
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
            else:
                out[f.name] = "<required>"
        return out


@dataclass
class RopeMethodConfig(MethodConfig):
    """A RoPE method. `layer_types` picks the attention types to rescale in models with several
    (Gemma 3 ...); None means every type that attends over the whole context (not sliding windows).
    `replace_native=True` allows rescaling a checkpoint that already ships its own rope scaling:
    the new method then starts from its plain rope_theta and its original pretraining context."""

    mechanisms: ClassVar[tuple[str, ...]] = ("rope",)

    layer_types: tuple[str, ...] | None = None
    replace_native: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_types is not None:
            if isinstance(self.layer_types, str):
                self.layer_types = (self.layer_types,)
            if not isinstance(self.layer_types, (list, tuple)):
                raise ParameterTypeError(f"layer_types must be a non-empty list of str, got {self.layer_types!r}")
            self.layer_types = tuple(self.layer_types)
            if not self.layer_types or not all(isinstance(t, str) for t in self.layer_types):
                raise ParameterTypeError(f"layer_types must be a non-empty list of str, got {self.layer_types!r}")
        if not isinstance(self.replace_native, bool):
            raise ParameterTypeError(f"replace_native must be a bool, got {self.replace_native!r}")


@dataclass
class BaseConfig(RopeMethodConfig):
    """Adjusted base frequency (ABF, Code Llama): a new rope_theta, given as theta= or as factor= times
    the old one. Here `factor` multiplies the base, not the context; max_position_embeddings
    (default: unchanged) only sets the advertised context."""

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = "new rope_theta (adjusted base frequency), theta= or factor= times the old base"

    theta: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("theta", self.theta, above=0)

    def resolve_theta(self, old_theta: float) -> float:
        if self.theta is None and self.factor is None:
            raise InvalidParameterError("method 'base' needs theta= (the new rope_theta, > 0) or factor= (> 0)")
        if self.theta is not None and self.factor is not None and not math.isclose(self.theta, old_theta * self.factor):
            raise InvalidParameterError(
                f"theta={self.theta!r} and factor={self.factor!r} disagree: the model's rope_theta is {old_theta!r}, "
                f"so factor={self.factor!r} means theta={old_theta * self.factor!r}; give one of them"
            )
        return float(self.theta if self.theta is not None else old_theta * self.factor)

    def resolve(self, original: int) -> BaseConfig:
        target = self.max_position_embeddings
        if target is not None and target < original:
            raise InvalidParameterError(
                f"max_position_embeddings={target} is shorter than the model's original context {original}; "
                f"it must be >= {original}"
            )
        return dataclasses.replace(self, max_position_embeddings=int(target or original))


@dataclass
class NTKConfig(RopeMethodConfig):
    """NTK-aware static scaling: theta' = theta * s^(d / (d - 2)), d the rotary dimension."""

    name: ClassVar[str] = "ntk"
    summary: ClassVar[str] = "NTK-aware scaling: theta * s^(d/(d-2))"


@dataclass
class LinearConfig(RopeMethodConfig):
    """Position interpolation (Chen et al. 2023): positions divided by the factor."""

    name: ClassVar[str] = "linear"
    summary: ClassVar[str] = "position interpolation (PI): positions / s"


@dataclass
class DynamicConfig(RopeMethodConfig):
    """Dynamic NTK: the base grows with the current length L past the *original* context L0,
    theta' = theta * (s * L / L0 - (s - 1))^(d / (d - 2)) with L capped at the target context;
    inputs up to L0 see the original model, factor 1 is the original model."""

    name: ClassVar[str] = "dynamic"
    summary: ClassVar[str] = "dynamic NTK, measured from the original context"
    length_dependent: ClassVar[bool] = True

    exact_cache: bool = False  # hf_posenc/methods/exact_cache.py: cached keys re-rotated at every step

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_exact_cache(self.exact_cache)


def _check_exact_cache(value) -> None:
    if not isinstance(value, bool):
        raise ParameterTypeError(f"exact_cache must be a bool, got {value!r}")


def _check_betas(beta_fast: float, beta_slow: float) -> None:
    check_number("beta_fast", beta_fast, above=0, optional=False)
    check_number("beta_slow", beta_slow, above=0, optional=False)
    if beta_fast <= beta_slow:
        raise InvalidParameterError(
            f"beta_fast must be > beta_slow (rotations that mark the extrapolated and the interpolated "
            f"dimensions), got beta_fast={beta_fast!r}, beta_slow={beta_slow!r}"
        )


@dataclass
class YarnConfig(RopeMethodConfig):
    """YaRN (Peng et al. 2023): NTK-by-parts interpolation plus an attention temperature
    (attention_factor, default 0.1 ln s + 1, or from mscale / mscale_all_dim)."""

    name: ClassVar[str] = "yarn"
    summary: ClassVar[str] = "YaRN: per-dimension interpolation ramp + attention factor"

    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_betas(self.beta_fast, self.beta_slow)
        check_number("attention_factor", self.attention_factor, above=0)
        check_number("mscale", self.mscale, above=0)
        check_number("mscale_all_dim", self.mscale_all_dim, above=0)
        if not isinstance(self.truncate, bool):
            raise ParameterTypeError(f"truncate must be a bool, got {self.truncate!r}")


@dataclass
class DynamicYarnConfig(RopeMethodConfig):
    """YaRN whose factor follows the current length: s = max(1, L / L0), capped at the target factor;
    inputs up to L0 see the original model exactly."""

    name: ClassVar[str] = "dynamic_yarn"
    summary: ClassVar[str] = "YaRN with s = max(1, L / original), exact inside the original context"
    length_dependent: ClassVar[bool] = True

    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    exact_cache: bool = False  # hf_posenc/methods/exact_cache.py: cached keys re-rotated at every step

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_betas(self.beta_fast, self.beta_slow)
        check_number("mscale", self.mscale, above=0)
        check_number("mscale_all_dim", self.mscale_all_dim, above=0)
        if not isinstance(self.truncate, bool):
            raise ParameterTypeError(f"truncate must be a bool, got {self.truncate!r}")
        _check_exact_cache(self.exact_cache)


@dataclass
class Llama3Config(RopeMethodConfig):
    """Llama 3.1's frequency-dependent scaling: long wavelengths / s, short ones kept, a smooth ramp between."""

    name: ClassVar[str] = "llama3"
    summary: ClassVar[str] = "Llama 3.1 scaling: low frequencies / s, high kept, smooth between"

    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("low_freq_factor", self.low_freq_factor, above=0, optional=False)
        check_number("high_freq_factor", self.high_freq_factor, above=0, optional=False)
        if self.high_freq_factor <= self.low_freq_factor:
            raise InvalidParameterError(
                f"high_freq_factor must be > low_freq_factor, got high_freq_factor={self.high_freq_factor!r}, "
                f"low_freq_factor={self.low_freq_factor!r}"
            )


@dataclass
class LongRopeConfig(RopeMethodConfig):
    """LongRoPE (Ding et al. 2024): one rescale factor per frequency, `long_factor` past the original
    context and `short_factor` (default all 1) inside it; one value per rotary pair (d/2 values)."""

    name: ClassVar[str] = "longrope"
    summary: ClassVar[str] = "LongRoPE: per-frequency factors, short and long sets"
    length_dependent: ClassVar[bool] = True  # switches between the two sets with the input length

    long_factor: list[float] | None = None
    short_factor: list[float] | None = None
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("long_factor", "short_factor"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, (str, bytes, dict, set)) or not hasattr(value, "__iter__"):
                raise ParameterTypeError(f"{name} must be a list of numbers, got {value!r}")
            value = [float(v) if not isinstance(v, bool) and isinstance(v, (int, float)) else v for v in value]
            for i, v in enumerate(value):
                check_number(f"{name}[{i}]", v, above=0, optional=False)
            setattr(self, name, value)
        check_number("attention_factor", self.attention_factor, above=0)

    def check_lengths(self, half_dim: int) -> None:
        if self.long_factor is None:
            raise InvalidParameterError(
                f"method 'longrope' needs long_factor= (a list of {half_dim} numbers, one per rotary pair)"
            )
        for name in ("long_factor", "short_factor"):
            value = getattr(self, name)
            if value is not None and len(value) != half_dim:
                raise InvalidParameterError(
                    f"{name} has {len(value)} values; this model's rotary dimension needs exactly {half_dim} "
                    f"(one per rotary pair, head_dim * partial_rotary_factor / 2)"
                )


ROPE_METHOD_CONFIGS: tuple[type[RopeMethodConfig], ...] = (
    BaseConfig, NTKConfig, LinearConfig, DynamicConfig, YarnConfig, DynamicYarnConfig, Llama3Config, LongRopeConfig,
)

__all__ = [c.__name__ for c in ROPE_METHOD_CONFIGS] + ["MethodConfig", "RopeMethodConfig", "check_number", "plain"]


# -- learned absolute position tables (GPT-2, OPT, BERT and their kin) ------------------------------

SINUSOIDAL_INITS = ("raw", "scaled", "fit")


@dataclass
class LearnedMethodConfig(MethodConfig):
    """A method for models whose positions are a learned table added to the input. The target context
    (max_position_embeddings=, or factor=) counts positions, not the padding rows some families keep
    below position 0 (OPT's 2, RoBERTa's padding_idx + 1)."""

    mechanisms: ClassVar[tuple[str, ...]] = ("learned",)


@dataclass
class SinusoidalConfig(LearnedMethodConfig):
    """The sinusoidal formula (Vaswani et al. 2017) PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...) in place of the
    learned table, at any length. `init`: "raw" (the formula as it is), "scaled" (times the ratio of the
    learned table's RMS to the formula's), "fit" (PE(pos) @ W + b, W and b fitted by least squares to the
    learned table). `fit_ridge` shrinks W (ridge lambda = fit_ridge * n / 2 for n fitted positions): an
    exact fit uses huge weights on the near-polynomial low frequencies and explodes past the original
    context. `trainable` (fit only) leaves W and b trainable. `keep_learned` keeps the first k positions'
    learned rows (position 0 of BERT/GPT-2 tables is an outlier no sinusoid fits). `max_position_embeddings`
    only sets the advertised context and the length of the table a saved checkpoint holds."""

    name: ClassVar[str] = "sinusoidal"
    summary: ClassVar[str] = "fixed sinusoidal positions in place of a learned table, any length; init raw/scaled/fit"

    init: str = "fit"
    base: float = 10000.0
    trainable: bool = False
    fit_ridge: float = 0.1
    keep_learned: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.init, str) or self.init not in SINUSOIDAL_INITS:
            raise InvalidParameterError(f"init must be one of {list(SINUSOIDAL_INITS)}, got {self.init!r}")
        check_number("base", self.base, above=1, optional=False)
        check_number("fit_ridge", self.fit_ridge, minimum=0, optional=False)
        check_number("keep_learned", self.keep_learned, minimum=0, integer=True, optional=False)
        if not isinstance(self.trainable, bool):
            raise ParameterTypeError(f"trainable must be a bool, got {self.trainable!r}")
        if self.trainable and self.init != "fit":
            raise InvalidParameterError(
                f"trainable=True needs init='fit' (init={self.init!r} has no weights to train; the fitted W and b are)"
            )


@dataclass
class InterpolateConfig(LearnedMethodConfig):
    """A longer learned table by linear interpolation: position p of the new table reads the old one at
    p * (N_old - 1) / (N_new - 1). Trainable afterwards."""

    name: ClassVar[str] = "interpolate"
    summary: ClassVar[str] = "longer learned table, linearly interpolated from the old one (trainable)"


@dataclass
class TileConfig(LearnedMethodConfig):
    """A longer learned table made of copies of the old rows, p -> p mod N_old (Longformer's
    initialisation). Trainable afterwards."""

    name: ClassVar[str] = "tile"
    summary: ClassVar[str] = "longer learned table, the old rows repeated (Longformer's init; trainable)"


LEARNED_METHOD_CONFIGS: tuple[type[LearnedMethodConfig], ...] = (SinusoidalConfig, InterpolateConfig, TileConfig)

__all__ += [c.__name__ for c in LEARNED_METHOD_CONFIGS] + ["LearnedMethodConfig"]


# -- mechanisms swapped through the attention call (ALiBi, relative bias, XPos, learned -> rotary) -----

@dataclass
class AttentionMethodConfig(MethodConfig):
    """A method that acts inside attention: a bias added to the scores, or a transform of q and k.
    None of them bounds the input length: `max_position_embeddings` (default: the original context)
    only sets the advertised context."""

    adds_bias: ClassVar[bool] = False  # needs an attention kernel that takes an additive float mask
    removes_positions: ClassVar[bool] = True  # drops the model's own table / rotation

    def resolve(self, original: int) -> AttentionMethodConfig:
        if self.factor is None and self.max_position_embeddings is None:
            return dataclasses.replace(self, factor=1.0, max_position_embeddings=int(original))
        return super().resolve(original)

    def length_limit(self, original: int) -> int | None:
        """The longest input the method (resolved) takes on a model of `original` context; None: any."""
        return None


@dataclass
class AlibiConfig(AttentionMethodConfig):
    """ALiBi (Press et al. 2022): the model's positions are removed and each head h adds -m_h * (i - j)
    to the score of query i and key j, with the paper's geometric slopes m_h. Encoders (bidirectional
    attention) get -m_h * |i - j|."""

    name: ClassVar[str] = "alibi"
    mechanisms: ClassVar[tuple[str, ...]] = ("learned", "rope")
    summary: ClassVar[str] = "ALiBi: positions removed, a fixed linear distance penalty per head on the scores"
    adds_bias: ClassVar[bool] = True


@dataclass
class RelativeBiasConfig(AttentionMethodConfig):
    """A learned bias per head and layer for each relative position j - i, clipped to [-k, k] (2k + 1
    values per head), or T5's log buckets (`buckets=` values per head, distances up to `max_distance`
    on a log scale). Initialised to zero: the model starts as itself without positions."""

    name: ClassVar[str] = "relative_bias"
    mechanisms: ClassVar[tuple[str, ...]] = ("learned", "rope")
    summary: ClassVar[str] = "learned per-head bias per clipped distance [-k, k] (or T5 log buckets), starts at 0"
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


@dataclass
class XposConfig(AttentionMethodConfig):
    """XPos (Sun et al. 2022): RoPE kept, and rotary pair i of q and k scaled by zeta_i^(+-position /
    scale_base), zeta_i = (2i/d + gamma) / (1 + gamma), so scores decay with distance."""

    name: ClassVar[str] = "xpos"
    mechanisms: ClassVar[tuple[str, ...]] = ("rope",)
    summary: ClassVar[str] = "XPos: RoPE plus a per-dimension exponential decay with distance"
    removes_positions: ClassVar[bool] = False

    gamma: float = 0.4
    scale_base: float = 512.0

    # the largest exponent of the q / k scale at the advertised context: e^60 leaves q and k themselves
    # ~e^28 of room before float32 / bfloat16 overflow (e^88), where scores would become inf and NaN
    MAX_EXPONENT: ClassVar[float] = 60.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("gamma", self.gamma, above=0, optional=False)
        check_number("scale_base", self.scale_base, above=0, optional=False)

    def resolve(self, original: int) -> XposConfig:
        resolved = super().resolve(original)
        # positions count from the middle of the keys (methods/xpos.py): the scale reaches zeta_0^(-L / 2 scale_base)
        rate = abs(math.log(self.gamma / (1 + self.gamma)))
        exponent = rate * resolved.max_position_embeddings / (2 * self.scale_base)
        if not exponent <= self.MAX_EXPONENT:
            raise InvalidParameterError(
                f"xpos with gamma={self.gamma!r} and scale_base={self.scale_base!r} scales q and k by up to e^"
                f"{exponent:.3g} at {resolved.max_position_embeddings} tokens, past the float range (e^88): the scores "
                f"would be inf or NaN. Use scale_base >= {rate * resolved.max_position_embeddings / (2 * self.MAX_EXPONENT):.4g} "
                f"(or a larger gamma, or a shorter max_position_embeddings)"
            )
        return resolved


@dataclass
class RopeSwapConfig(AttentionMethodConfig):
    """Rotary positions in place of a learned table: q and k of every layer rotated (RoPE, base
    `theta`), on the first `partial_rotary_factor` of each head's channels. The model becomes a RoPE
    model: every RoPE scaling method applies to it afterwards."""

    name: ClassVar[str] = "rope"
    mechanisms: ClassVar[tuple[str, ...]] = ("learned",)
    summary: ClassVar[str] = "learned table removed, rotary q/k rotation (base theta) in its place"

    theta: float = 10000.0
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("theta", self.theta, above=1, optional=False)
        check_number("partial_rotary_factor", self.partial_rotary_factor, above=0, optional=False)
        if self.partial_rotary_factor > 1:
            raise InvalidParameterError(
                f"partial_rotary_factor is the share of each head's channels that rotate, in (0, 1]; "
                f"got {self.partial_rotary_factor!r}"
            )


ATTENTION_METHOD_CONFIGS: tuple[type[AttentionMethodConfig], ...] = (
    AlibiConfig, RelativeBiasConfig, XposConfig, RopeSwapConfig,
)

__all__ += [c.__name__ for c in ATTENTION_METHOD_CONFIGS] + ["AttentionMethodConfig"]
