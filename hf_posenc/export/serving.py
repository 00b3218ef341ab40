"""What a serving engine needs to run a patched model: vLLM's `--hf-overrides`, llama.cpp's flags, and
a GGUF file whose rope-scaling metadata says what the patch does.

    hp.serving_overrides(model)     # {"max_position_embeddings": 32768, "rope_parameters": {...}} for vLLM
    hp.llama_cpp_args(model)        # ["--rope-scaling", "yarn", "--rope-scale", "4", ...]
    hp.write_gguf(model, "in.gguf", "out-4x.gguf")   # the same tensors, the patch in the metadata

Engines read the attention factor (the scale on cos/sin, so on q and k) from different keys, each engine's
formula transcribed in tests/test_engine_formulas.py: transformers takes YaRN's and LongRoPE's `attention_factor`
whole; vLLM 0.33 reads YaRN's `attention_factor` too, 0.11 only `attn_factor`, a multiplier on its own 0.1 ln s + 1
(Peng et al. 2023), and both read LongRoPE's as `short_mscale` / `long_mscale` (else sqrt(1 + ln s / ln L)); llama.cpp multiplies its own scale (0.1 ln s + 1
for YaRN, 1 otherwise) by the GGUF key `rope.scaling.attn_factor`, and overwrites `--yarn-attn-factor` for YaRN.
A patch writes the vLLM keys into the saved config beside transformers' own (so a saved folder serves as it ran),
and the GGUF key here; llama.cpp's flags cannot carry a non-default YaRN scale.

On a model with one RoPE per attention type (Gemma 3), llama.cpp's flags and GGUF rope keys reach the
full-attention layers only (its gemma3 loader keeps the sliding layers at their own base and scale), so a
patch of the full-attention layers exports as it does for a model with one RoPE.

What is exported is decided from what the patched config holds, as a saved checkpoint holds it, not from
method names: its `rope_parameters` must be rope types the engine computes as transformers does (any stock
transformers type for vLLM; plain RoPE, linear and YaRN for llama.cpp). A method no engine can run from a
config says why in its `export_refusal` (the dynamic methods: engines' `dynamic` measures from a different
context, and none has dynamic YaRN; every attention method: ALiBi, relative bias, XPos, DCA, Self-Extend,
learned -> rope change the attention itself; learned tables: the table is in the weights)."""

from __future__ import annotations

import contextlib
import copy
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import _compat
from . import gguf_header
from ..config import LearnedMethodConfig, MethodConfig, RopeMethodConfig, check_bool
from ..errors import InvalidInputError, MethodNotApplicableError, PosEncError
from ..methods.yarn import default_attention_factor
from ..record import PatchRecord
from ..record_reader import method_class, read_record
from ..registry import METHODS, as_model

if TYPE_CHECKING:
    import numpy as np

# the rope types each engine computes as transformers does, from a config: vLLM builds every stock transformers
# type; llama.cpp's rope options say a base, linear or YaRN scaling (llama3 / longrope need per-frequency tensors)
VLLM_ROPE_TYPES = _compat.STOCK_ROPE_TYPES
LLAMA_CPP_ROPE_TYPES = ("default", "linear", "yarn")
# A GGUF file carries per-pair factors as tensors, which no flag can: LongRoPE's two sets and llama3's one.
GGUF_ROPE_TYPES = LLAMA_CPP_ROPE_TYPES + ("longrope", "llama3")
# llama.cpp's architectures whose loader (src/models/<arch>.cpp) reads LongRoPE's `rope_factors_long.weight` and
# `rope_factors_short.weight` (the llama-like ones only when `{arch}.rope.scaling.type` is "longrope"; phi3, phimoe
# and minicpm3 always), and those that read one set, `rope_freqs.weight` (how llama.cpp's converter writes llama3).
# Both are one F32 tensor of n_rot / 2 values; the rope kernel divides pair i's angle by value i.
LLAMA_CPP_LONGROPE_ARCHS = ("llama", "deci", "granite", "minicpm", "mistral3", "refact", "phi3", "phimoe", "minicpm3")
LLAMA_CPP_ROPE_FREQS_ARCHS = ("llama", "deci", "granite", "minicpm", "mistral3", "refact", "llama4", "exaone",
                              "exaone4", "arcee")
FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def _written_rope_type(cls: type[MethodConfig]) -> str | None:
    """The rope_type a RoPE method writes, asked of it at 2x on a 64-position model with 16 rotary dims, with
    the defaults an evaluation variant fills in (longrope's per-pair factor lists)."""
    params = cls.variant_defaults({}, 128, {"max_position_embeddings": 64, "rotary_dim": 16})
    method = cls.from_dict(params).resolve(64)
    return method.rope_parameters({"rope_type": "default", "rope_theta": 10000.0}, 64, 16).get("rope_type")


# For front ends that check a method before any model is loaded (the command line), by the same rule: the
# methods whose saved config is stock transformers (rope_parameters an engine reads as they are), the
# learned-table ones (a plain table in the weights), and the RoPE methods whose rope_type llama.cpp expresses.
STOCK_METHODS = tuple(n for n, c in METHODS.items() if issubclass(c, RopeMethodConfig) and c.stock_checkpoint)
TABLE_METHODS = tuple(n for n, c in METHODS.items() if issubclass(c, LearnedMethodConfig) and c.stock_checkpoint)
LLAMA_CPP_METHODS = tuple(n for n in STOCK_METHODS if _written_rope_type(METHODS[n]) in LLAMA_CPP_ROPE_TYPES)
GGUF_METHODS = tuple(n for n in STOCK_METHODS if _written_rope_type(METHODS[n]) in GGUF_ROPE_TYPES)
# Models with one RoPE per attention type whose llama.cpp loader keeps the sliding-window layers at their own
# RoPE base and scale, so that llama.cpp's rope options (flags, GGUF rope keys) reach the full-attention layers
# only: transformers' text model_type -> llama.cpp's architecture. llama.cpp's src/llama-model.cpp sets
# rope_freq_base_train_swa = 10000 and rope_freq_scale_train_swa = 1 for LLM_ARCH_GEMMA3, and its
# get_rope_freq_base / get_rope_freq_scale return those for the sliding layers, the context's (flags, GGUF
# keys) for the others; src/models/gemma3.cpp rotates each layer with them.
LLAMA_CPP_OWN_SWA_ROPE = {"gemma3_text": "gemma3"}


class ExportError(PosEncError, ValueError):
    """A file to export from or to that cannot be used (not a GGUF file, the output is the input, ...)."""


def _patch(model: torch.nn.Module, engine: str, rope_types: tuple[str, ...], call: str,
           flags: bool = False) -> PatchRecord | None:
    """The model's patch record (None: unpatched), refused unless `engine` runs it from the config: no patch in it
    (a stacked one's base included) says why not (`export_refusal`), and every rope_type it holds is one of
    `rope_types` (`flags`: llama.cpp's command line, which cannot carry per-pair factors: a GGUF file can)."""
    model = as_model(model, call)
    record = check_config_exports(model.config, engine, rope_types, flags)
    if record is not None:
        _check_config_runs(model, engine)
    return record


def _check_config_runs(model: torch.nn.Module, engine: str) -> None:
    """What an engine is given is the config: it must be the RoPE the model runs. A config edited after the patch
    (rope_parameters changed by hand) would be exported as another model without a word."""
    text = model.config.get_text_config()
    rotaries = [m for m in model.modules() if _compat.is_rotary_module(m)]
    if len(rotaries) != 1 or _compat.rope_layer_types(text) != [None] or not hasattr(rotaries[0], "inv_freq"):
        return   # one RoPE per layer type, or a module of hf_posenc's own: nothing read from a config alone
    rotary = rotaries[0]
    if rotary.inv_freq.is_meta:
        return   # a skeleton: no frequencies yet
    running = rotary.inv_freq.detach().double().cpu()
    params = _compat.get_rope_parameters(text, None)
    lengths = [None]
    if params.get("rope_type") == "longrope":   # after a long forward the module holds the long set
        lengths.append(int(params.get("original_max_position_embeddings", text.max_position_embeddings)) + 1)
    written = [_compat.rope_init(text, None, n, type(rotary))[0].double().cpu() for n in lengths]
    if not any(w.shape == running.shape and torch.allclose(w, running, rtol=1e-5, atol=0) for w in written):
        raise MethodNotApplicableError(
            f"the model's config was edited after its patch: its rope_parameters give other frequencies than its "
            f"rotary module runs, so {engine} would serve another model; patch the model again instead of editing "
            f"model.config")


def check_config_exports(config, engine: str, rope_types: tuple[str, ...], flags: bool = False) -> PatchRecord | None:
    """`_patch` on a config alone (a saved folder's, read before its model is built): the record, or the refusal
    that names what the patch is and why `engine` cannot run it."""
    record = read_record(config)
    if record is None:
        return None
    chain = [record]
    while chain[-1].base is not None:
        chain.append(chain[-1].base)
    why = next((method_class(r).export_refusal for r in chain if method_class(r).export_refusal), None)
    text = config.get_text_config()
    if why is None:
        held = [_compat.get_rope_parameters(text, lt).get("rope_type", "default")
                for lt in _compat.rope_layer_types(text)]
        unknown = next((t for t in held if t not in rope_types), None)
        if unknown is not None:
            why = f"its rope_parameters have rope_type {unknown!r}, and {engine} has no {unknown!r} rope scaling"
            if flags and unknown in GGUF_ROPE_TYPES:
                why = (f"its rope_parameters have rope_type {unknown!r}, whose per-pair factors no flag carries; "
                       f"write them into a GGUF file with hp.write_gguf (hf-posenc patch ... --out model.gguf)")
    if why is not None:
        raise MethodNotApplicableError(
            f"method {record.method!r} cannot be exported to {engine}: {why}. {engine} runs, from a config, the "
            f"rope types {', '.join(rope_types)}")
    _check_pair_factors(text)
    return record


def _check_pair_factors(text) -> None:
    """The per-pair factor lists of the config's rope_parameters (LongRoPE's `long_factor` and `short_factor`) hold
    one number per rotary pair: a list edited to another length would end deep in transformers' rope function."""
    for layer_type in _compat.rope_layer_types(text):
        params = _compat.get_rope_parameters(text, layer_type)
        if params.get("rope_type") != "longrope":
            continue
        half = _compat.rotary_dim(text, layer_type) // 2
        where = "rope_parameters" + (f"[{layer_type!r}]" if layer_type is not None else "")
        for key in ("long_factor", "short_factor"):
            value = params.get(key)
            numbers = isinstance(value, (list, tuple)) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            if not numbers or len(value) != half:
                got = f"has {len(value)} values" if numbers else f"is {value!r:.40}"
                raise MethodNotApplicableError(
                    f"the model's {where} {key} {got}; it must be a list of {half} numbers, one per rotary pair "
                    f"(half the rotary dimension {2 * half}): the config was edited after its patch; patch the "
                    f"model again rather than editing its rope_parameters")


def yarn_attention_factor(model: torch.nn.Module, layer_type: str | None = None) -> float:
    """The scale a YaRN patch puts on cos and sin, computed by transformers' own YaRN function."""
    return rope_attention_factor(model, layer_type)


def yarn_scale_over_default(model: torch.nn.Module, layer_type: str | None, factor: float) -> float:
    """A YaRN patch's scale over YaRN's default 0.1 ln s + 1 (1: the default), which llama.cpp computes itself."""
    return yarn_attention_factor(model, layer_type) / default_attention_factor(factor)


def rope_attention_factor(model: torch.nn.Module, layer_type: str | None = None) -> float:
    """The scale the model's rope_parameters put on cos and sin (YaRN's, LongRoPE's), computed by transformers."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text = model.config.get_text_config()
    rope_type = _compat.get_rope_parameters(text, layer_type)["rope_type"]
    return float(ROPE_INIT_FUNCTIONS[rope_type](text, "cpu", layer_type=layer_type)[1])


def pair_factors(model: torch.nn.Module, layer_type: str | None = None) -> list[float]:
    """What the patch divides each rotary pair's frequency by past the original context: the unpatched
    frequencies over the patched ones, both as transformers computes them (llama3's factors, for rope_freqs)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text = model.config.get_text_config()
    params = _compat.get_rope_parameters(text, layer_type)
    dim = _compat.rotary_dim(text, layer_type)
    plain = 1.0 / (float(params["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaled = ROPE_INIT_FUNCTIONS[params["rope_type"]](text, "cpu", seq_len=text.max_position_embeddings,
                                                      layer_type=layer_type)[0].double()
    return (plain / scaled).tolist()


def serving_overrides(model: torch.nn.Module, *, legacy: bool = False) -> dict:
    """The config fields that make an engine reading config.json (vLLM's `--hf-overrides`) build the
    patched model from the original checkpoint: the target context and the `rope_parameters`, YaRN's
    `attention_factor` written out. `legacy=True`: as `rope_theta` + `rope_scaling`, for engines built
    on transformers 4 (vLLM releases of that time read only those). {} for an unpatched model."""
    check_bool("legacy", legacy)  # legacy="no" is truthy: a typo would silently pick the other format
    record = _patch(model, "vLLM", VLLM_ROPE_TYPES, "serving_overrides")
    if record is None:
        return {}
    text = model.config.get_text_config()
    params = copy.deepcopy(text.rope_parameters)
    layer_types = _compat.rope_layer_types(text)  # [None]: one RoPE; else one per attention type (Gemma 3 ...)
    nested = layer_types != [None]
    for layer_type in layer_types:
        p = params[layer_type] if nested else params
        if p.get("rope_type") == "yarn" and p.get("attention_factor") is None:
            p["attention_factor"] = yarn_attention_factor(model, layer_type)
        if p.get("rope_type") == "longrope":   # vLLM reads LongRoPE's scale as short_mscale / long_mscale only
            p["short_mscale"] = p["long_mscale"] = rope_attention_factor(model, layer_type)
    out = {"max_position_embeddings": int(text.max_position_embeddings)}
    if not legacy:
        out["rope_parameters"] = params
    elif nested:
        raise MethodNotApplicableError(
            "per-layer-type RoPE (this model's rope_parameters has one entry per attention type) has no "
            "legacy rope_scaling form; use legacy=False (engines on transformers 5)")
    else:   # as a saved folder carries them (hf_posenc._compat.legacy_rope_keys), "type" spelled for older releases
        legacy = _compat.legacy_rope_form(params)
        scaling = legacy.pop("rope_scaling")
        out |= legacy
        if scaling is not None:
            out["rope_scaling"] = {**scaling, "type": scaling["rope_type"]}
    if text is not model.config:  # a composite model: the text config is a sub-config
        name = next(k for k, v in vars(model.config).items() if v is text)
        out = {name: out}
    return out


def llama_cpp_args(model: torch.nn.Module) -> list[str]:
    """llama.cpp command-line flags (llama-cli, llama-server) that run the patched model from the
    original GGUF file: the new rope base, or the scaling type, factor, original context, YaRN's betas
    and its attention factor in llama.cpp's terms (divided by its built-in 0.1 ln s + 1)."""
    record = _patch(model, "llama.cpp", LLAMA_CPP_ROPE_TYPES, "llama_cpp_args", flags=True)
    if record is None:
        return []
    text = model.config.get_text_config()
    arch = LLAMA_CPP_OWN_SWA_ROPE.get(text.model_type)  # None: llama.cpp's loader takes one RoPE for all layers
    params, layer_type = _llama_cpp_rope_parameters(model, record, "llama.cpp", arch)
    args = ["--rope-freq-base", _num(params["rope_theta"]), "--ctx-size", str(text.max_position_embeddings)]
    rope_type = params.get("rope_type", "default")
    if rope_type == "linear":
        args += ["--rope-scaling", "linear", "--rope-scale", _num(params["factor"])]
    elif rope_type == "yarn":
        if params.get("truncate", True) is False:
            raise MethodNotApplicableError("llama.cpp always rounds YaRN's correction range (truncate=True); "
                                           "this patch has truncate=False")
        factor = float(params["factor"])
        args += ["--rope-scaling", "yarn", "--rope-scale", _num(factor),
                 "--yarn-orig-ctx", str(params["original_max_position_embeddings"]),
                 "--yarn-beta-fast", _num(params.get("beta_fast", 32.0)),
                 "--yarn-beta-slow", _num(params.get("beta_slow", 1.0))]
        if not math.isclose(yarn_scale_over_default(model, layer_type, factor), 1.0, rel_tol=1e-6):
            # llama.cpp's src/llama-context.cpp (0c1e57098, llama_context's constructor) sets the YaRN scale to its
            # own 0.1 ln s + 1 whenever ext_factor != 0, whatever --yarn-attn-factor says (since its PR 17945)
            raise MethodNotApplicableError(
                f"llama.cpp overwrites --yarn-attn-factor with its own YaRN scale 0.1 ln s + 1 = "
                f"{default_attention_factor(factor):.6g}; this patch's attention factor "
                f"{yarn_attention_factor(model, layer_type):.6g} goes in the GGUF "
                f"key rope.scaling.attn_factor: write a GGUF file with hp.write_gguf (hf-posenc patch ... --out "
                f"model.gguf)")
    return args


def _llama_cpp_rope_parameters(model: torch.nn.Module, record: PatchRecord, engine: str,
                               arch: str | None) -> tuple[dict, str | None]:
    """The rope_parameters llama.cpp's rope options (flags or GGUF keys) set, and their layer type (None: one
    RoPE for all layers). On a model with one RoPE per attention type, llama.cpp's options reach the
    full-attention layers only where its loader for the architecture `arch` keeps the sliding layers at their
    own base and scale (LLAMA_CPP_OWN_SWA_ROPE); the patch must then leave the sliding layers as they were."""
    text = model.config.get_text_config()
    layer_types = _compat.rope_layer_types(text)
    if layer_types == [None]:
        return text.rope_parameters, None
    if arch not in LLAMA_CPP_OWN_SWA_ROPE.values():
        raise MethodNotApplicableError(
            f"{engine} takes one RoPE for all layers of a {arch or text.model_type} model; this model has one per "
            f"attention type ({layer_types}). llama.cpp keeps the sliding layers at their own RoPE for "
            f"{', '.join(sorted(set(LLAMA_CPP_OWN_SWA_ROPE.values())))} only")
    local = [t for t in layer_types if _compat.is_local_layer_type(t)]
    full = [t for t in layer_types if t not in local]
    original = record.original.rope_parameters
    touched = [t for t in local if _compat.get_rope_parameters(text, t) != original.get(t)]
    if touched or len(full) != 1:
        raise MethodNotApplicableError(
            f"llama.cpp's {arch} loader keeps the sliding layers at their own RoPE base and scale and applies its rope "
            f"options to the full-attention layers only; this patch "
            + (f"rescales the sliding layers {touched} too: patch the full-attention layers only (the default "
               f"layer_types)" if touched else f"has {len(full)} full-attention layer types {full}, not one"))
    params = _compat.get_rope_parameters(text, full[0])
    if params.get("rope_type") == "yarn":
        factor = float(params["factor"])
        if not math.isclose(yarn_scale_over_default(model, full[0], factor), 1.0, rel_tol=1e-6):
            raise MethodNotApplicableError(
                f"llama.cpp's {arch} graph multiplies every layer's cos and sin by one attention scale, the sliding "
                f"layers' too; this YaRN patch's attention factor {yarn_attention_factor(model, full[0]):.6g} "
                f"differs from YaRN's default 0.1 ln s + 1 = {default_attention_factor(factor):.6g}, so the sliding "
                f"layers would be scaled as well. "
                f"Leave attention_factor at its default to export it")
    return params, full[0]


def _num(value: float) -> str:
    return f"{float(value):.9g}"


# -- GGUF -------------------------------------------------------------------------------------------

def gguf_rope_metadata(model: torch.nn.Module, arch: str) -> dict[str, object]:
    """The GGUF keys (`{arch}.rope.*`, `{arch}.context_length`) that say what the patch does, as llama.cpp
    reads them. YaRN's betas and attention factor are read from the file by only some of llama.cpp's
    architectures, so a YaRN patch that needs other values than llama.cpp's defaults is refused here
    (run the original file with `llama_cpp_args(model)` instead)."""
    record = _patch(model, "GGUF", GGUF_ROPE_TYPES, "write_gguf")
    if record is None:
        return {}
    text = model.config.get_text_config()
    params, layer_type = _llama_cpp_rope_parameters(model, record, "GGUF", arch)
    out: dict[str, object] = {f"{arch}.context_length": int(text.max_position_embeddings),
                              f"{arch}.rope.freq_base": float(params["rope_theta"])}
    rope_type = params.get("rope_type", "default")
    if rope_type in ("longrope", "llama3"):
        archs = LLAMA_CPP_LONGROPE_ARCHS if rope_type == "longrope" else LLAMA_CPP_ROPE_FREQS_ARCHS
        if arch not in archs:
            raise MethodNotApplicableError(
                f"llama.cpp's {arch} loader reads no {rope_type} factor tensors; it reads them for the "
                f"architectures {', '.join(archs)}")
        # no rope.scaling.factor: llama.cpp would scale every pair by it on top of the tensors
        out[f"{arch}.rope.scaling.original_context_length"] = int(params["original_max_position_embeddings"])
        if rope_type == "longrope":
            out[f"{arch}.rope.scaling.type"] = "longrope"
            out[f"{arch}.rope.scaling.attn_factor"] = rope_attention_factor(model, layer_type)
    if rope_type in ("linear", "yarn"):
        out |= {f"{arch}.rope.scaling.type": rope_type, f"{arch}.rope.scaling.factor": float(params["factor"])}
    if rope_type == "yarn":
        factor = float(params["factor"])
        defaults = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
        differ = {k: params[k] for k, v in defaults.items() if k in params and params[k] != v}
        if differ:
            flags = "" if differ.get("truncate", True) is False else \
                f"; run the original file with: {' '.join(llama_cpp_args(model))}"
            raise MethodNotApplicableError(
                f"a GGUF file cannot make llama.cpp use this YaRN patch's {differ} (its llama loader takes "
                f"llama.cpp's defaults: beta_fast 32, beta_slow 1, the range rounded){flags}")
        out[f"{arch}.rope.scaling.original_context_length"] = int(params["original_max_position_embeddings"])
        over = yarn_scale_over_default(model, layer_type, factor)
        if not math.isclose(over, 1.0, rel_tol=1e-6):
            # llama.cpp serves its own 0.1 ln s + 1 times this key (src/llama-context.cpp, 0c1e57098)
            out[f"{arch}.rope.scaling.attn_factor"] = over
    return out


def gguf_rope_tensors(model: torch.nn.Module, arch: str) -> dict[str, np.ndarray]:
    """The per-pair factor tensors a GGUF file needs for the patch (F32, one value per rotary pair): LongRoPE's
    `rope_factors_long.weight` / `rope_factors_short.weight`, llama3's `rope_freqs.weight`; {} for the others.
    llama.cpp takes the long set whenever its context (-c) is longer than the original, for every sequence, where
    transformers switches by each input's length."""
    import numpy as np

    record = _patch(model, "GGUF", GGUF_ROPE_TYPES, "write_gguf")
    if record is None:
        return {}
    params, layer_type = _llama_cpp_rope_parameters(model, record, "GGUF", arch)
    rope_type = params.get("rope_type", "default")
    if rope_type == "longrope":
        return {"rope_factors_long.weight": np.asarray(params["long_factor"], dtype=np.float32),
                "rope_factors_short.weight": np.asarray(params["short_factor"], dtype=np.float32)}
    if rope_type == "llama3":
        return {"rope_freqs.weight": np.asarray(pair_factors(model, layer_type), dtype=np.float32)}
    return {}


def check_gguf_output(source: Path | None, target: Path, overwrite: bool, source_is: str) -> None:
    """The GGUF file read (`source`, what the message calls it: `source_is`; None where none is) exists, and
    `target` is a new file in an existing folder, neither that file nor a folder, or one `overwrite` allows to
    replace."""
    if source is not None and source.is_dir():
        raise ExportError(f"{source} is a folder, and {source_is} must be a GGUF file: name the .gguf file")
    if source is not None and not source.is_file():
        raise ExportError(f"GGUF file not found: {source}")
    if target.exists() and ((source is not None and target.resolve() == source.resolve()) or target.is_dir()):
        raise ExportError(f"the output {target} is {source_is if target.is_file() else 'a folder'}; "
                          f"name a new .gguf file")
    folder = target.parent
    if not folder.is_dir():
        raise ExportError(f"the output's folder {folder} {'is a file' if folder.exists() else 'does not exist'}; "
                          f"create the folder first, or name a .gguf file in an existing one")
    if target.exists() and not overwrite:
        raise ExportError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")


@contextlib.contextmanager
def whole_file(target: Path):
    """A temporary path beside `target` that becomes `target` when the block ends without error, and is removed
    otherwise: the file appears whole or not at all. The hidden temporary file a killed run left (its process gone)
    is removed first."""
    for stale in target.parent.glob(f".{target.name}.tmp*"):
        pid = stale.name.rpartition(".tmp")[2]
        if pid.isdigit() and not _running(int(pid)):
            stale.unlink(missing_ok=True)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process: alive
        return True
    return True


def add_gguf_fields(writer, fields, new: dict[str, object]) -> None:
    """Copy `fields` (a gguf.GGUFReader's, already filtered) into `writer`, then the keys `new`, each in the type
    llama.cpp's converter gives it: str, bool, float (float32), int (uint32), a list of str or of int (int32)."""
    import gguf

    kinds = gguf.GGUFValueType
    for key, field in fields:
        sub = field.types[-1] if field.types[0] == kinds.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for key, value in new.items():
        if isinstance(value, list):
            sub = kinds.STRING if all(isinstance(v, str) for v in value) else kinds.INT32
            writer.add_key_value(key, value, kinds.ARRAY, sub_type=sub)
        else:
            kind = (kinds.BOOL if isinstance(value, bool) else kinds.STRING if isinstance(value, str)
                    else kinds.FLOAT32 if isinstance(value, float) else kinds.UINT32)
            writer.add_key_value(key, value, kind)


def check_write_gguf(model: torch.nn.Module, source: str | os.PathLike, target: str | os.PathLike, *,
                     overwrite: bool = False) -> tuple[str, dict[str, object]]:
    """Everything `write_gguf` checks before it reads the tensors, from the source's header alone (a fraction
    of a second on any file): the paths, the file is the model's, the patch is one GGUF metadata can say.
    Returns (the file's architecture, the keys to write). `model` may be a meta skeleton (no weights)."""
    if not isinstance(model, torch.nn.Module) or not hasattr(getattr(model, "config", None), "get_text_config"):
        raise InvalidInputError(f"write_gguf takes the transformers model patched from the file (hp.load_model of "
                                f"it, then hp.patch), got {type(model).__name__}")
    source, target = Path(source), Path(target)
    check_gguf_output(source, target, overwrite, "the input file")
    try:  # the header only: gguf's reader maps every tensor and array (seconds), and fails unclearly on corruption
        values = gguf_header.read(source).values
    except (ValueError, OSError, IndexError, KeyError) as err:
        raise ExportError(f"{source} is not a readable GGUF file: {err}") from None
    arch = values.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ExportError(f"{source} is not a readable GGUF file: it names no general.architecture")
    _check_same_model(model, values, arch, source)
    new = gguf_rope_metadata(model, arch)
    if not new:
        raise ExportError("the model carries no hf_posenc patch: there is nothing to write")
    held = [n for n in gguf_header.read(source).tensor_names if n in FACTOR_TENSORS]
    if held:   # whatever the new patch: llama.cpp divides every pair's frequency by the tensor it finds
        raise ExportError(f"{source} already holds {', '.join(held)}: per-pair factors of an earlier scaling, which "
                          f"llama.cpp would read beside the new ones; export from the unpatched model's file")
    return arch, new


def write_gguf(model: torch.nn.Module, source: str | os.PathLike, target: str | os.PathLike, *,
               overwrite: bool = False) -> dict[str, object]:
    """Copy the GGUF file `source` (the checkpoint `model` was loaded from) to `target` with the patch's
    rope metadata; tensors are copied byte for byte (quantized ones stay quantized). Everything is checked
    before writing (from the header, before the tensors are read: `check_write_gguf`), and the file appears
    whole or not at all. Returns the keys written, and the factor tensors added (`gguf_rope_tensors`) as lists."""
    arch, new = check_write_gguf(model, source, target, overwrite=overwrite)
    tensors = gguf_rope_tensors(model, arch)
    import gguf

    source, target = Path(source), Path(target)
    try:
        reader = gguf.GGUFReader(source)
    except (ValueError, OSError, IndexError, KeyError) as err:
        raise ExportError(f"{source} is not a readable GGUF file: {err}") from None
    with whole_file(target) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
        # the writer adds the header fields and the architecture itself
        add_gguf_fields(writer, [(k, f) for k, f in reader.fields.items() if not k.startswith("GGUF.")
                                 and k != "general.architecture" and k not in new], new)
        for tensor in reader.tensors:
            writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                                   raw_dtype=tensor.tensor_type)
        for name, values in tensors.items():   # the per-pair factors, after the model's own tensors
            writer.add_tensor_info(name, values.shape, values.dtype, values.nbytes)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in reader.tensors:
            writer.write_tensor_data(tensor.data)
        for values in tensors.values():
            writer.write_tensor_data(values)
        writer.close()
    return {**new, **{name: values.tolist() for name, values in tensors.items()}}


def _check_same_model(model, values: dict, arch: str, source: Path) -> None:
    """The file must hold the model before the patch: same rotary width, same rope base."""
    text = model.config.get_text_config()
    heads, width = values.get(f"{arch}.attention.head_count"), values.get(f"{arch}.embedding_length")
    dims = values.get(f"{arch}.rope.dimension_count") or (width // heads if isinstance(width, int) and
                                                           isinstance(heads, int) and heads > 0 else None)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rotary = int(head_dim * getattr(text, "partial_rotary_factor", 1.0))
    if isinstance(dims, int) and dims != rotary:   # a factor tensor of the model's pairs would not fit the file's
        raise ExportError(f"{source} rotates {dims} dimensions of each head, this model {rotary}: it is not the "
                          f"file this model was loaded from")
    record = read_record(model.config)
    base = values.get(f"{arch}.rope.freq_base")
    if record is None or base is None:
        return
    original = record.original.rope_parameters
    if "rope_theta" in original:
        theta = original.get("rope_theta")
    else:  # one RoPE per attention type: the file's freq_base is the full-attention layers' (gemma3)
        full = [t for t in original if not _compat.is_local_layer_type(t)] or list(original)
        theta = (original.get(full[0]) or {}).get("rope_theta") if full else None
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise ExportError(f"{source}: {arch}.rope.freq_base is {base!r}, not a number: not a readable GGUF file")
    if theta is not None and not math.isclose(float(base), float(theta), rel_tol=1e-5):
        raise ExportError(f"{source} has rope freq_base {base:g}, but the model was patched from "
                          f"rope_theta {theta:g}: it is not the file this model was loaded from")


def read_gguf_rope(path: str | os.PathLike) -> dict[str, object]:
    """The rope keys of a GGUF file (`rope.*` and `context_length` of its architecture), without the arch
    prefix: what llama.cpp will use."""
    values = gguf_header.read(path).values
    arch = values.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InvalidInputError(f"{path}: the GGUF file names no general.architecture")
    return {key[len(arch) + 1:]: value for key, value in values.items()
            if key.startswith(f"{arch}.rope.") or key == f"{arch}.context_length"}


def gguf_patch(path: str | os.PathLike) -> tuple[str, dict] | None:
    """The patch a GGUF file's rope metadata describes, as (method, hp.patch parameters) with the original
    context among them (`original_max_position_embeddings`), or None for plain RoPE. transformers reads a
    llama-architecture file's context and rope base but not its rope scaling: without this, such a file
    (written by `write_gguf`, or by llama.cpp's converter from a scaled checkpoint) loads unscaled. Per-pair
    factors come back as `longrope`: LongRoPE's two sets, or one static set from `rope_freqs.weight` (llama3's as
    `write_gguf` writes it, with the original context beside it)."""
    rope = read_gguf_rope(path)
    kind = rope.get("rope.scaling.type")
    # llama.cpp divides every pair's frequency by rope_freqs.weight wherever its loader finds it (llama3 as its
    # converter writes it, with or without the original context): one static set
    freqs = kind != "longrope" and "rope_freqs.weight" in gguf_header.read(path).tensor_names
    attn = rope.get("rope.scaling.attn_factor")
    if kind not in ("linear", "yarn", "longrope") and not freqs:
        if attn is not None and attn != 1:   # llama.cpp scales cos and sin by it whatever the scaling type
            raise InvalidInputError(f"{path}: the GGUF key rope.scaling.attn_factor is {attn!r} with no rope scaling "
                                    f"type (rope.scaling.type {kind!r}); llama.cpp scales plain RoPE by it, which "
                                    f"hf_posenc does not load: remove the key or name a scaling type")
        return None
    kind = "longrope" if freqs else kind

    def number(key: str, integer: bool = False, needed: bool = True):
        value = rope.get(key)
        if value is None and not needed:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InvalidInputError(f"{path}: the GGUF key {key} is {value!r}; {kind} rope scaling needs a "
                                    f"positive {'integer' if integer else 'number'} there")
        return int(value) if integer else float(value)

    target = number("context_length", integer=True)
    if kind == "longrope":
        original = number("rope.scaling.original_context_length", integer=True, needed=False) or target
        names = ["rope_freqs.weight"] * 2 if freqs else ["rope_factors_long.weight", "rope_factors_short.weight"]
        long, short = _gguf_factors(path, names)
        params = {"max_position_embeddings": target, "original_max_position_embeddings": original,
                  "long_factor": long, "short_factor": short,
                  "attention_factor": number("rope.scaling.attn_factor", needed=False) or 1.0}
        return kind, params
    factor = number("rope.scaling.factor")
    original = number("rope.scaling.original_context_length", integer=True, needed=False) or round(target / factor)
    params = {"max_position_embeddings": target, "original_max_position_embeddings": max(original, 1)}
    for key in ("beta_fast", "beta_slow"):
        if f"rope.scaling.yarn_{key}" in rope and kind == "yarn":
            params[key] = number(f"rope.scaling.yarn_{key}")
    scale = number("rope.scaling.attn_factor", needed=False)
    if scale is not None and scale != 1:
        if kind != "yarn":   # linear: llama.cpp scales cos and sin by it, which transformers' linear cannot say
            raise InvalidInputError(f"{path}: the GGUF key rope.scaling.attn_factor is {scale!r} beside {kind} rope "
                                    f"scaling, a scale transformers' {kind} cannot say; hf_posenc does not load it")
        params["attention_factor"] = scale * default_attention_factor(factor)   # llama.cpp's YaRN scale times the key
    return kind, params


def _gguf_factors(path, names: list[str]) -> list[list[float]]:
    """The values of the named F32 factor tensors of a GGUF file (one per rotary pair)."""
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    out = []
    for name in names:
        tensor = tensors.get(name)
        if tensor is None or tensor.tensor_type != gguf.GGMLQuantizationType.F32:
            raise InvalidInputError(f"{path}: longrope rope scaling needs the F32 tensor {name}, "
                                    f"{'which is missing' if tensor is None else 'stored as ' + tensor.tensor_type.name}")
        out.append([float(v) for v in tensor.data.reshape(-1)])
    return out
