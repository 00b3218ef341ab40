"""What every method shares: the checks of its parameters, and the interface of each kind of method.

A method is one module in hf_posenc/methods/ (yarn.py, dca.py, ...): a dataclass of its parameters, which
checks them in `__post_init__` (a bad value is refused before the model is touched), and what it does to a
model, through the small interface of its kind (`RopeMethodConfig` and `LearnedMethodConfig` below;
`AttentionMethodConfig` beside the attention mechanism it drives, hf_posenc/attention.py). The families call that
interface; they never ask a method its name.
`resolve(original)` fills the target context and the factor from each other once the model's original
context is known. A method registers itself where it is defined, with `@register_method` on its class (the
table `METHODS` lives here, below the methods; hf_posenc.registry imports every method module and looks
them up). docs/ARCHITECTURE.md says how to add a method."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from .errors import (InvalidParameterError, ParameterTypeError, RegistrationError, SequenceTooLongError,
                     UnknownMethodError)
from .named import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn


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


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ParameterTypeError(f"{name} must be a bool, got {value!r}")


@dataclass(frozen=True)
class Refused:
    """Parameters a method refuses, and words the error message must hold (a contract's `refused`)."""

    params: dict[str, Any]
    error: str


@dataclass(frozen=True)
class Contract:
    """What a method declares for the contract suite (tests/test_contracts.py), which runs the same checks on
    every registered method: refusals leave the model untouched, patch / unpatch and `hp.patched` restore it bit
    for bit, save -> `hp.from_pretrained` (and stock transformers where `stock_checkpoint`) gives the same
    logits, the record round-trips, serving exports agree with the saved config, cached generation equals the
    full forward.

    `examples`: parameters `hp.patch` takes (at least one; the first runs on every family the suite picks, the
    others on the reference family of each mechanism), completed for a model by the method's
    `variant_defaults(example, 2 * original, hp.describe(model))` as an evaluation variant is.
    `refused`: parameters it refuses (at least one), each with words of the error.
    `unchanged_within`: a share of the original context: inputs up to that many tokens give the unpatched
    model's logits with the first example (dynamic scaling inside the original context, DCA inside a chunk), bit
    for bit, or within `unchanged_tolerance` (absolute and relative) for a method that computes them another way.
    `reference`: the test that checks the method against its paper or transformers ("tests/test_x.py::test_y").

    For a RoPE method (tests/test_rope.py, tests/test_rope_families.py, tests/test_serving.py):
    `unpatched_at_factor_1`: whether the method at its defaults with a target of the original context (factor 1)
    is the unpatched model, bit for bit, on every family (False for a method whose own parameters change the
    rotation at any factor: NTK at a fixed alpha). Checked both ways: a method that says False must change it.
    `factor_1_tolerance`: within it (absolute and relative) rather than bit for bit, for a formula that rounds at
    factor 1 (Llama 3.1's ramp mixes inv_freq / 1 and inv_freq: 1 ulp apart on some families).
    `expected_rope_parameters`: for a `stock_checkpoint` method, the rope_parameters it must write, written out
    from the paper, independently of the method's code: a function of the layer's rope_theta, its rotary dimension
    and its original context giving the keys the first example writes at twice the original context (completed by
    `variant_defaults` as above), e.g. `lambda theta, dim, original: {"rope_type": "linear", "factor": 2.0}`; the
    families' own rotary modules are then checked against transformers' built from them."""

    examples: tuple[dict[str, Any], ...]
    refused: tuple[Refused, ...]
    unchanged_within: float | None = None
    unchanged_tolerance: float = 0.0
    reference: str | None = None
    unpatched_at_factor_1: bool = True
    factor_1_tolerance: float = 0.0
    expected_rope_parameters: Callable[[float, int, int], dict[str, Any]] | None = None


@dataclass
class MethodConfig:
    """Fields every method shares: the target context, or the factor over the original one."""

    name: ClassVar[str]
    mechanisms: ClassVar[tuple[str, ...]]
    summary: ClassVar[str] = ""
    # True when positions of a token depend on the length of the whole input (dynamic scaling):
    # a one-pass evaluation or cached generation is not the same as separate forwards.
    length_dependent: ClassVar[bool] = False
    # True when a checkpoint it saves is a stock transformers checkpoint of the same model (rope_parameters
    # transformers builds, or a plain learned table): engines and stock loading read it as it is
    stock_checkpoint: ClassVar[bool] = False
    # True for a method that writes rope_parameters into a learned-table model's config (learned -> rope):
    # the model is a RoPE model from then on, and a RoPE scaling method may be stacked on it
    writes_rope_parameters: ClassVar[bool] = False
    # Why a fine-tune cannot give this method's model position ids spread over a longer target (train.positions,
    # hf_posenc/train/positions.py), or None when it can: the ids must be what sets every distance the model sees
    skipped_positions: ClassVar[str | None] = None
    # what the contract suite runs the method with (tests/test_contracts.py); every registered method declares one
    contract: ClassVar[Contract | None] = None
    # Why a serving engine cannot run the patch from a config override (vLLM's --hf-overrides, llama.cpp's flags),
    # or None when the saved rope_parameters decide (hf_posenc/export/serving.py reads them)
    export_refusal: ClassVar[str | None] = None
    # False when the method's own parameters say what it does (NTK at a fixed alpha; the attention methods): without
    # max_position_embeddings= or factor=, the target context is the original one. True: one of them is required
    needs_target: ClassVar[bool] = True

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
        if factor is None and target is None and not self.needs_target:
            factor, target = 1.0, original
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
    def stacks_on(cls, below: type[MethodConfig]) -> bool:
        """Whether this method may be patched on a model already patched with `below` (the patch below stays,
        `hp.unpatch` peels this one off first). No by default: a patch is on an unpatched model."""
        return False

    def length_limit(self, original: int) -> int | None:
        """The longest input the method (resolved) takes on a model of `original` context; None: any."""
        return None

    def check_length(self, length: int, original: int) -> None:
        """Refuse an input of `length` tokens past `length_limit` (for `hp.check_length`, before a forward)."""
        limit = self.length_limit(original)
        if limit is not None and length > limit:
            raise SequenceTooLongError(
                f"an input of {length} tokens is longer than method {self.name!r} takes with its parameters on an "
                f"original context of {original}: at most {limit} tokens")

    @classmethod
    def variant_defaults(cls, params: dict, target: int, info: dict) -> dict:
        """The parameters an evaluation variant runs with at a target context of `target` tokens, from the
        ones it gave (`params`) and `hp.describe` of the model (`info`): by default the target context,
        unless the variant gave its own max_position_embeddings= or factor=."""
        if "max_position_embeddings" in params or "factor" in params:
            return dict(params)
        return dict(params) | {"max_position_embeddings": target}

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



METHODS = Registry("method", MethodConfig, setting="hp.patch(model, NAME) and saved records",
                   decorator="register_method", error=UnknownMethodError)


def register_method(cls: type[MethodConfig]) -> type[MethodConfig]:
    """Class decorator: register `cls` under `cls.name` (what hp.patch, records and the command line call it).
    A name another class already holds is refused, naming both, so two methods never shadow each other."""
    if isinstance(cls, type) and issubclass(cls, MethodConfig) and not any(
            isinstance(getattr(cls, "mechanisms", None), tuple) and m in ("rope", "learned")
            for m in getattr(cls, "mechanisms", ())):
        raise RegistrationError(f"{cls.__qualname__}.mechanisms must name 'rope' and / or 'learned', got "
                                f"{getattr(cls, 'mechanisms', None)!r}")
    return METHODS.register(cls)


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

    # True when hf_posenc sets the frequencies for each input length (LengthDependentRotary): the method's
    # `parameters_at_length` then gives them. False for the static methods, and for the length-dependent
    # ones transformers' own rotary module handles (longrope switches its two factor sets itself).
    follows_length: ClassVar[bool] = False

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        """The rope_parameters that make transformers build this method (resolved), for a layer type whose
        plain RoPE settings are `base` (rope_theta, partial_rotary_factor, ..., rope_type "default"),
        pretrained at `original` tokens, with `dim` rotary channels. Methods transformers lacks return a
        rope_type it refuses (methods.rope.CUSTOM_ROPE_TYPE_PREFIX + name)."""
        raise NotImplementedError(f"method {self.name!r} does not write rope_parameters")

    def parameters_at_length(self, base: dict, original: int, seq_len: int) -> dict:
        """For a method that `follows_length`: the static rope_parameters it amounts to for an input of
        `seq_len` tokens, original < seq_len <= the target context (hf_posenc.methods.rope evaluates them)."""
        raise NotImplementedError(f"method {self.name!r} does not depend on the input length")

    def check_rotary(self, dim: int) -> None:
        """Refuse a model whose rotary dimension `dim` the parameters do not fit (longrope's per-pair lists)."""

    def check_layer_types(self, config, layer_types: list[str | None]) -> None:
        """Refuse, before anything changes, a model whose RoPE layer types `layer_types` (the ones it rescales;
        [None]: one RoPE for all layers) cannot carry the method's parameters (`config`: the text config)."""

    def finish_plan(self, plan: PatchPlan, model: nn.Module, new_config, layer_types: list[str | None]) -> None:
        """Change the family's plan further, before it is applied: `plan.swaps` holds the rebuilt rotary
        modules; `new_config` is the text config copy. Nothing by default (exact_cache.py's re-rotation)."""

    @classmethod
    def stacks_on(cls, below: type[MethodConfig]) -> bool:
        # a learned -> rope swap makes the model a RoPE model: a frequency method rescales its rotation
        return below.writes_rope_parameters


# -- learned absolute position tables (GPT-2, OPT, BERT and their kin) ------------------------------

@dataclass
class LearnedMethodConfig(MethodConfig):
    """A method for models whose positions are a learned table added to the input. The target context
    (max_position_embeddings=, or factor=) counts positions, not the padding rows some families keep
    below position 0 (OPT's 2, RoBERTa's padding_idx + 1). Methods that make a longer learned table
    derive from `methods.learned.GrownTableConfig`, which only asks for the rows."""

    mechanisms: ClassVar[tuple[str, ...]] = ("learned",)
    stock_checkpoint: ClassVar[bool] = True  # the saved table is the one the module equals, under the table's name
    export_refusal: ClassVar[str | None] = (
        "its saved checkpoint is a plain learned position table, which an engine reads from the weights (serve the "
        "saved folder; no config override rebuilds the table)")
    # True when the new table has no last position (a function of the position, not rows): it lifts any limit
    unbounded: ClassVar[bool] = False
    skipped_positions: ClassVar[str | None] = (
        "a learned table has one trained row per absolute position and no notion of distance: skipped ids would "
        "train far rows on a few scattered windows without teaching any distance; fine-tune it contiguously at "
        "the new length")

    def build_table(self, old: nn.Embedding, *, offset: int, positions: int, call: str) -> tuple[nn.Module, dict]:
        """The module in place of the table `old` (resolved method; `offset` rows below position 0, of which
        `positions` are learned; `call`: how the model calls it, methods.learned.CALL_STYLES), and what the
        checkpoint's record keeps about it (a JSON dict, given back to `restore_table`). Saved, the module
        holds the table it equals under the table's own name, so stock transformers loads it."""
        raise NotImplementedError

    def checkpoint_parts(self) -> tuple[str, ...]:
        """The tensors of each table's module `restore_table` reads from a saved checkpoint ("weight",
        "projection.weight", ...); the checkpoint must hold them."""
        return ()

    def restore_table(self, stock: nn.Embedding, *, offset: int, call: str, info: dict,
                      saved: dict[str, torch.Tensor]) -> nn.Module:
        """The patched module again, from the table stock transformers loaded from a saved checkpoint, the
        record's `info` for it and the `saved` tensors of `checkpoint_parts` (for `hp.from_pretrained`)."""
        raise NotImplementedError


# -- mechanisms swapped through the attention call (ALiBi, relative bias, XPos, DCA, ...) -----------

if TYPE_CHECKING:
    from .plan import PatchPlan
