"""Everything that knows transformers versions and config formats lives here.

transformers v5 keeps RoPE settings in `config.rope_parameters`: either one flat dict
(`{"rope_type": ..., "rope_theta": ..., ...}`) or, for models with several attention types
(Gemma 3, ...), a dict nested by layer type (`{"full_attention": {...}, "sliding_attention": {...}}`).
A flat dict is addressed here with `layer_type=None`.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import os
import sys
import warnings

import torch
import transformers
from packaging.version import Version

TRANSFORMERS_FLOOR = "5.23.0"  # the oldest version the test suite runs against

if Version(transformers.__version__) < Version(TRANSFORMERS_FLOOR):
    raise ImportError(
        f"hf_posenc needs transformers>={TRANSFORMERS_FLOOR} (the v5 `rope_parameters` format); "
        f"found {transformers.__version__}. Upgrade with: pip install 'transformers>={TRANSFORMERS_FLOOR},<6'"
    )

from transformers import PreTrainedConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402

# The rotary module a model without one gets (learned -> rope): transformers' own, with partial rotary.
GENERIC_ROTARY = GPTNeoXRotaryEmbedding

# rope_type names transformers computes itself (their math is transformers'), "default" included.
STOCK_ROPE_TYPES = ("default", *ROPE_INIT_FUNCTIONS)
# Families whose rotary module returns complex frequencies (freqs_cis, multiplied into q and k seen as complex
# numbers) rather than a (cos, sin) pair.
COMPLEX_ROTARY_MODEL_TYPES = ("llama4_text", "llama4")
# Families whose rotary pairs are interleaved channels (2i, 2i + 1) rather than (i, i + d/2) (complex
# frequencies pair adjacent channels too).
INTERLEAVED_ROTARY_MODEL_TYPES = ("cohere", "cohere2", "cohere2_moe", "deepseek_v3", "glm4_moe_lite", "mistral4",
                                  "youtu", "blt", "axk1", *COMPLEX_ROTARY_MODEL_TYPES)
# Layer types that only ever attend inside a window: rescaling them gains nothing.
_LOCAL_LAYER_HINTS = ("sliding", "chunked", "local")


def native_bfloat16(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether `device` (default: the GPU if any, else the CPU) runs bfloat16 matrix work natively, and
    what says so. torch's CPU capability string reads "AVX512" with or without AVX512-BF16, so the CPU is
    asked through torch.cpu's own probes (AMX tiles, AVX512-BF16); without them torch emulates bfloat16,
    several times slower than float32 (a SmolLM2 forward at 4096 tokens: 74.5 s against 20.4 s, AVX2)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, f"{torch.cuda.get_device_name(device)} {'runs' if ok else 'does not run'} bfloat16"
    if device.type != "cpu":
        return False, f"bfloat16 support of {device.type} devices is not known here"
    capability = torch.backends.cpu.get_cpu_capability()
    probes = {"AMX": "_is_amx_tile_supported", "AVX512-BF16": "_is_avx512_bf16_supported"}
    found = [name for name, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)()]
    if found and not capability.startswith("AVX512"):
        # the hardware has it, but torch's kernels are held below AVX512 (ATEN_CPU_CAPABILITY=avx2, or an OS
        # that hides it): its bfloat16 attention then fails ("pack_vnni2 is only supported when avx512 ...")
        return False, (f"this CPU has {', '.join(found)}, but torch runs at capability {capability}, whose kernels "
                       f"emulate bfloat16 (or refuse it): float32")
    if found:
        return True, f"this CPU runs bfloat16 natively ({', '.join(found)}; torch capability {capability})"
    return False, (f"this CPU has no native bfloat16 (torch capability {capability}, no AVX512-BF16 or AMX): "
                   f"bfloat16 would be emulated, several times slower than float32")


def rope_layer_types(config: PreTrainedConfig) -> list[str | None]:
    """The keys of a nested `rope_parameters`, or `[None]` when it is one flat dict."""
    params = getattr(config, "rope_parameters", None) or {}
    nested = config.nested_rope_parameter_keys(params) if hasattr(config, "nested_rope_parameter_keys") else []
    return [key for key in nested if params[key] is not None] or [None]


def global_layer_types(config: PreTrainedConfig) -> list[str | None]:
    """Layer types whose attention spans the whole context (the ones a context extension rescales)."""
    types = rope_layer_types(config)
    if types == [None]:
        return types
    return [t for t in types if not is_local_layer_type(t)] or types


def is_local_layer_type(layer_type: str | None) -> bool:
    """Whether a layer type only ever attends inside a window (sliding, chunked, local attention)."""
    return layer_type is not None and any(hint in layer_type for hint in _LOCAL_LAYER_HINTS)


def get_rope_parameters(config: PreTrainedConfig, layer_type: str | None) -> dict:
    params = config.rope_parameters
    return dict(params if layer_type is None else params[layer_type])


def set_rope_parameters(config: PreTrainedConfig, layer_type: str | None, value: dict) -> None:
    if layer_type is None:
        config.rope_parameters = dict(value)
    else:
        config.rope_parameters = {**config.rope_parameters, layer_type: dict(value)}


# What transformers 4.x reads of a RoPE (and so vLLM 0.11 and other 4.x stacks): `rope_theta` and `rope_scaling` at
# the top of config.json, and for longrope the top-level `original_max_position_embeddings`, which its switch to the
# long factors and its default attention factor read (transformers 4.57.1, modeling_rope_utils.py:
# `longrope_frequency_update` and `_compute_longrope_parameters`). transformers 5 writes only `rope_parameters`, which
# 4.x ignores: it would serve rope_theta 10000 without scaling. These keys sit in the config's own attributes, so
# every `save_pretrained` writes them; transformers 5 reads `rope_scaling` before `rope_parameters`
# (`convert_rope_params_to_dict`), so they are written equal to it, rope_theta aside.
LEGACY_ROPE_KEYS = ("rope_theta", "rope_scaling", "original_max_position_embeddings", "partial_rotary_factor",
                    "rope_local_base_freq")


# A RoPE per layer type is kept by 4.x in keys of the family's own (transformers 4.57.1): Gemma 3 and 3n build the
# full layers' rotary from `rope_theta` + `rope_scaling` and the sliding layers' as default from
# `rope_local_base_freq` (modeling_gemma3.py, `rotary_emb_local`); OLMo 3 builds its sliding layers' as default from
# the same `rope_theta` (modeling_olmo3.py, `rotary_embs`). The key of the sliding layers' theta, None where shared.
LOCAL_THETA_KEYS = {"gemma3_text": "rope_local_base_freq", "gemma3n_text": "rope_local_base_freq", "olmo3": None}


def legacy_rope_keys(config: PreTrainedConfig) -> dict | None:
    """The keys transformers 4.x reads for this config's RoPE, or None where 4.x has no form for it."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        return _legacy_layer_type_form(getattr(config, "model_type", None), params)
    return legacy_rope_form(params)


def _legacy_layer_type_form(model_type: str | None, params: dict) -> dict | None:
    """`legacy_rope_keys` of a RoPE per layer type: only the families of LOCAL_THETA_KEYS have a 4.x form, and only
    while the sliding layers keep a plain RoPE (4.x builds theirs as default, whatever the config says)."""
    if model_type not in LOCAL_THETA_KEYS or set(params) != {"full_attention", "sliding_attention"}:
        return None
    full, local = params["full_attention"], params["sliding_attention"]
    if not isinstance(full, dict) or not isinstance(local, dict) \
            or local.get("rope_type", "default") != "default" or set(local) - {"rope_type", "rope_theta"}:
        return None
    keys = legacy_rope_form(full)
    local_key = LOCAL_THETA_KEYS[model_type]
    if local_key is not None:
        keys[local_key] = local.get("rope_theta")
    elif local.get("rope_theta") != full.get("rope_theta"):
        return None   # OLMo 3 in 4.x: one rope_theta for both
    return keys


def legacy_rope_form(params: dict | None) -> dict | None:
    """`legacy_rope_keys` of a rope_parameters dict."""
    if not isinstance(params, dict) or not params or any(isinstance(v, dict) for v in params.values()):
        return None
    rope_type = params.get("rope_type", params.get("type", "default"))
    keys = {"rope_theta": params.get("rope_theta")}
    if rope_type == "default":
        keys["rope_scaling"] = None
    else:
        keys["rope_scaling"] = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if rope_type == "longrope" and "original_max_position_embeddings" in params:
        keys["original_max_position_embeddings"] = params["original_max_position_embeddings"]
    if "partial_rotary_factor" in params:   # 4.x's rope functions read it at the top of the config
        keys["partial_rotary_factor"] = params["partial_rotary_factor"]
    return keys


CUSTOM_ROPE_TYPE_PREFIX = "hf_posenc_"   # the rope_types hf_posenc registers: stock transformers builds none of them


def has_custom_rope_type(config: PreTrainedConfig) -> bool:
    """Whether a rope_type of the config (or of a config nested in it, a layer type's included) is one of hf_posenc's
    own, which stock transformers cannot build."""
    for sub in sub_configs(config):
        params = getattr(sub, "rope_parameters", None)
        if not isinstance(params, dict):
            continue
        for p in [params, *(v for v in params.values() if isinstance(v, dict))]:
            if str(p.get("rope_type", "")).startswith(CUSTOM_ROPE_TYPE_PREFIX):
                return True
    return False


def drop_legacy_original(config: PreTrainedConfig) -> None:
    """Remove a top-level original_max_position_embeddings that `write_legacy_rope_keys` wrote for a longrope
    patch, where the config's class has no such field of its own (Phi-3's is its own, and stays)."""
    if "original_max_position_embeddings" not in inspect.signature(type(config).__init__).parameters:
        vars(config).pop("original_max_position_embeddings", None)


def write_legacy_rope_keys(config: PreTrainedConfig) -> None:
    """Write (or, where 4.x has no form for a RoPE, remove) the 4.x keys in the own attributes of `config` and of
    every config nested in it that has a RoPE, from their `rope_parameters` as they are now: called wherever
    hf_posenc installs or loads a config."""
    for sub in sub_configs(config):
        if not has_rope(sub) or "rope_parameters" not in inspect.signature(type(sub).__init__).parameters:
            continue   # a family without a RoPE of its own (GPT-2 given one): 4.x has none to read, 5 reads no keys
        state, keys = vars(sub), legacy_rope_keys(sub)
        if keys is None:
            for key in ("rope_scaling", "rope_theta", "rope_local_base_freq"):   # no stale form left
                state.pop(key, None)
            if sub.model_type in LOCAL_THETA_KEYS:   # a family 4.x knows, whose stock form it would read instead
                shared = "" if LOCAL_THETA_KEYS[sub.model_type] else ", at the rope_theta of the full layers"
                warnings.warn(
                    f"transformers 4.x (and vLLM 0.11) has no form for this {sub.model_type} RoPE (its sliding layers "
                    f"keep a plain RoPE there{shared}): a folder saved from it is read there as another model "
                    f"(4.x's default RoPE for the family); serve it with transformers >= 5",
                    stacklevel=user_stacklevel())
        else:
            state.update(copy.deepcopy(keys))   # a top-level original_max_position_embeddings: the original context


def user_stacklevel() -> int:
    """The `stacklevel` that makes a warning raised by the caller name the first line outside hf_posenc (the user's
    call), however deep in the package the caller sits."""
    package, frame, level = os.path.dirname(os.path.abspath(__file__)), sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def head_dim(config: PreTrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_dim(config: PreTrainedConfig, layer_type: str | None) -> int:
    """Number of rotated channels per head (partial rotary: GPT-NeoX, Phi, StableLM, ...)."""
    factor = get_rope_parameters(config, layer_type).get("partial_rotary_factor", 1.0)
    return int(head_dim(config) * factor)


def has_rope(config: PreTrainedConfig) -> bool:
    params = getattr(config, "rope_parameters", None)
    return isinstance(params, dict) and bool(params)


def sub_configs(config: PreTrainedConfig) -> list[PreTrainedConfig]:
    """The config and every config nested in it (text_config, vision_config, ...), depth first."""
    found = [config]
    for value in vars(config).values():
        if isinstance(value, PreTrainedConfig):
            found.extend(sub_configs(value))
    return found


def copy_config_tree(config: PreTrainedConfig) -> tuple[PreTrainedConfig, dict[int, PreTrainedConfig]]:
    """A deep copy of `config`, and a map from id(old sub-config) to its copy."""
    new = copy.deepcopy(config)
    return new, {id(old): twin for old, twin in zip(sub_configs(config), sub_configs(new))}


def is_rotary_module(module: torch.nn.Module) -> bool:
    """transformers' rotary modules: built from a config, they hold `rope_type` and `inv_freq` buffers."""
    return (
        type(module).__name__.endswith("RotaryEmbedding")
        and isinstance(getattr(module, "config", None), PreTrainedConfig)
        and hasattr(module, "rope_type")
        and any(name.endswith("inv_freq") for name, _ in module.named_buffers(recurse=False))
    )


def single_rotary(model: torch.nn.Module, needs: str) -> torch.nn.Module:
    """The model's one rotary module, for work that `needs` one RoPE for every layer ("the factor search takes"):
    a model with several, or with a RoPE per layer type, is refused saying so."""
    from .errors import MethodNotApplicableError

    found = [m for m in model.modules() if is_rotary_module(m)]
    text = model.config.get_text_config()
    if len(found) != 1 or rope_layer_types(text) != [None]:
        raise MethodNotApplicableError(
            f"{needs} a model with one RoPE for every layer; this {text.model_type} model has "
            f"{len(found)} rotary module(s) and rope layer types {rope_layer_types(text)}")
    return found[0]


def build_rotary(module_cls: type, config: PreTrainedConfig, device: torch.device | None) -> torch.nn.Module:
    """Build a family's own rotary module from `config`, the way the family's model does."""
    if "device" in inspect.signature(module_cls.__init__).parameters:
        return module_cls(config=config, device=device)
    return module_cls(config=config).to(device)


def rope_validation_error(config: PreTrainedConfig) -> str | None:
    """Why the config class's own RoPE check refuses `config`'s rope_parameters, or None when it
    accepts them. Some families accept only their own rope types (Phi-3: "default" and "longrope";
    Phi-MoE: its mscale fields); transformers runs this check in `save_pretrained`, too late."""
    if not hasattr(config, "validate_rope"):
        return None
    # transformers only warns about rope types it has no validator for (hf_posenc's own markers)
    rope_logger = logging.getLogger("transformers.modeling_rope_utils")
    level = rope_logger.level
    rope_logger.setLevel(logging.ERROR)
    try:
        copy.deepcopy(config).validate_rope()  # some validators write into the config they check
    except Exception as error:  # ValueError, TypeError, KeyError, huggingface_hub's validation error
        cause = getattr(error, "__cause__", None) or error
        return f"{type(cause).__name__}: {str(cause).strip()}"
    finally:
        rope_logger.setLevel(level)
    return None


def register_custom_rope_types(rope_types) -> None:
    """Give each rope_type hf_posenc writes for a method transformers lacks (`hf_posenc_<method>`) a validator
    on transformers' `RotaryEmbeddingConfigMixin`, which looks one up by name at every config creation, load
    and save and otherwise warns "Missing validation function ..." each time. The validator checks what
    such a config must hold (a known marker, a numeric factor >= 1 and an int original context where
    given); building the model still fails loudly in stock transformers (no ROPE_INIT_FUNCTIONS entry),
    and hf_posenc reads the patch from its record."""
    from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

    for rope_type in rope_types:
        name = f"_validate_{rope_type}_rope_parameters"
        if not hasattr(RotaryEmbeddingConfigMixin, name):
            setattr(RotaryEmbeddingConfigMixin, name, _validate_custom_rope_parameters)


def _validate_custom_rope_parameters(self, rope_parameters: dict, ignore_keys=None) -> None:
    factor = rope_parameters.get("factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1):
        raise ValueError(f"rope_parameters {rope_parameters['rope_type']!r}: factor must be a number >= 1, "
                         f"got {factor!r}")
    original = rope_parameters.get("original_max_position_embeddings")
    if original is not None and (isinstance(original, bool) or not isinstance(original, int) or original < 1):
        raise ValueError(f"rope_parameters {rope_parameters['rope_type']!r}: original_max_position_embeddings "
                         f"must be an int >= 1, got {original!r}")


def rope_init(config: PreTrainedConfig, layer_type: str | None, seq_len: int | None, module_cls: type, device=None):
    """(inv_freq, attention_scaling) for `config`'s rope_parameters, computed by transformers itself."""
    rope_type = get_rope_parameters(config, layer_type)["rope_type"]
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    if rope_type == "default":  # keywords: 5.24 takes (config, **kwargs), earlier releases (config, device, ...)
        return module_cls.compute_default_rope_parameters(config, device=device, **kwargs)
    return ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=seq_len, **kwargs)


def drop_gguf_quantization(model: torch.nn.Module) -> None:
    """transformers de-quantizes GGUF weights on load but keeps the GGUF quantizer attached, which
    blocks `save_pretrained`. The weights are plain tensors: detach the quantizer."""
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def cache_length(past_key_values) -> int:
    """Tokens already in a KV cache (a transformers Cache, a legacy tuple of (key, value) pairs, or None)."""
    if past_key_values is None:
        return 0
    if hasattr(past_key_values, "get_seq_length"):
        return int(past_key_values.get_seq_length())
    return int(past_key_values[0][0].shape[-2]) if len(past_key_values) else 0


def cache_argument(model: torch.nn.Module) -> str:
    """The name a model's forward takes its KV cache by: `cache` (transformers >= 5.24, which deprecates
    the old name) or `past_key_values`."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


# -- the attention call ------------------------------------------------------------------------------

def attention_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of each self-attention module that calls transformers' attention interface
    (it holds `scaling` and `is_causal`); cross-attention modules are left out."""
    return [
        (name, module) for name, module in model.named_modules()
        if hasattr(module, "scaling") and hasattr(module, "is_causal")
        and not getattr(module, "is_cross_attention", False) and "Cross" not in type(module).__name__
    ]


def attention_implementation(config: PreTrainedConfig) -> str:
    return config._attn_implementation or "eager"


def set_attention_implementation(config: PreTrainedConfig, name: str) -> None:
    config._attn_implementation = name


def attention_function(name: str, module: torch.nn.Module):
    """The attention function `module` runs under implementation `name`: the registered one, or for
    "eager" the model's own `eager_attention_forward` (each modeling file has its own)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def register_attention(name: str, function, like: str) -> None:
    """Register `function` as attention implementation `name`, its masks built as for `like`."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[like])


def known_attention(name: str) -> bool:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return name == "eager" or name in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


def _safetensors_files(path) -> list[str]:
    """The safetensors files of a checkpoint (a local folder or a hub id), sharded or not."""
    import json
    import os

    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

    def find(name):
        local = os.path.join(str(path), name)
        if os.path.isfile(local):
            return local
        return cached_file(str(path), name, _raise_exceptions_for_missing_entries=False)

    if single := find(SAFE_WEIGHTS_NAME):
        return [single]
    if index := find(SAFE_WEIGHTS_INDEX_NAME):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [find(shard) for shard in shards]
    raise FileNotFoundError(f"no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} in {path}")


def read_checkpoint_tensors(path, names: list[str]) -> dict[str, torch.Tensor]:
    """Tensors of a saved checkpoint whose key is one of `names` or ends with "." + one of them (the key's
    prefix depends on the head class that saved it: `transformer.wpe...` for GPT2LMHeadModel)."""
    from safetensors import safe_open

    found = {}
    for file in _safetensors_files(path):
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                for name in names:
                    if key == name or key.endswith("." + name):
                        found[name] = f.get_tensor(key)
    return found


class _DropLoadReport:
    """A logging filter that drops transformers' LOAD REPORT when every key it lists is UNEXPECTED (extra
    tensors hf_posenc saved and reads back itself) or MISMATCH (tables it saved empty and replaces) and
    ends with one of `suffixes`."""

    def __init__(self, suffixes: tuple[str, ...]):
        self.suffixes = suffixes

    def filter(self, record) -> bool:
        message = record.getMessage()
        if "LOAD REPORT" not in message:
            return True
        rows = [line.split("|") for line in message.splitlines() if line.count("|") >= 2]
        rows = [(cells[0].strip(), cells[1].strip()) for cells in rows if cells[0].strip() not in ("", "Key")]
        ours = all(status in ("UNEXPECTED", "MISMATCH") and key.endswith(self.suffixes) for key, status in rows)
        return not (rows and ours)


@contextlib.contextmanager
def quiet_load_report(suffixes: tuple[str, ...]):
    """While loading a checkpoint that holds tensors hf_posenc reads or replaces itself, keep transformers
    from reporting them (any other finding is still reported)."""
    logger = logging.getLogger("transformers.modeling_utils")
    drop = _DropLoadReport(suffixes)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


# -- attention with its log-sum-exp (Dual Chunk Attention, Self-Extend) -------------------------------

def attention_with_lse(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: torch.Tensor | None = None,
                       causal: bool = False, scale: float | None = None,
                       on_fallback=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of query [b, h, q, d] over key / value [b, h_kv, k, d] (h_kv divides h: kv head j
    serves query heads j * h / h_kv .. (j + 1) * h / h_kv - 1), and the log-sum-exp of each query's scaled
    scores (float32, [b, h, q]): what merges attention over disjoint key
    sets into one softmax. `mask`: float, added to the scores, [q, k] or broadcastable to [b, h, q, k];
    `causal`: query i sees keys 0..i (q == k). A query that sees no key gets output 0 and lse 0: the caller
    knows those rows and sets their lse to -inf.

    torch's fused kernels return the log-sum-exp through private ops (torch 2.13: the CPU flash kernel;
    on CUDA the memory-efficient kernel, unmasked calls only, which the CPU test suite does not exercise).
    The log-sum-exp has no gradient through them, so while autograd
    records, and on other devices or versions where the ops are missing, the fallback computes the scores of
    this call in float32 (q x k floats: callers keep q to a block of queries). The fused kernels take q, k and
    v in one dtype. `on_fallback(reason)`, when given, is called with why each time the fallback runs."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        reason = "autograd records, and the fused kernel's log-sum-exp has no gradient"
    else:
        try:
            if query.device.type == "cpu":  # takes grouped kv heads itself
                attn_mask = None if mask is None else mask.to(query.dtype).expand(*query.shape[:2], *mask.shape[-2:])
                out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    query, key, value, 0.0, causal, attn_mask=attn_mask, scale=scale)
                return out, lse
            if query.device.type == "cuda" and mask is None:
                key, value = _repeat_kv(key, query.shape[1]), _repeat_kv(value, query.shape[1])
                out, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
                    query, key, value, None, True, 0.0, causal, scale=scale)
                return out, lse[..., :query.shape[-2]]  # padded to a multiple of the kernel's block
            masked = " of a masked call" if query.device.type == "cuda" else ""
            reason = f"no fused kernel returns the log-sum-exp{masked} on {query.device.type}"
        except (AttributeError, RuntimeError, NotImplementedError) as error:
            first_line = (str(error).splitlines() or [""])[0][:200]
            reason = f"the fused kernel refused the call ({type(error).__name__}: {first_line})"
    if on_fallback is not None:
        on_fallback(reason)
    return attention_with_lse_reference(query, key, value, mask=mask, causal=causal, scale=scale)


def attention_with_lse_reference(query, key, value, *, mask=None, causal=False, scale=None):
    """`attention_with_lse` written out: float32 scores, their log-sum-exp, the weighted values."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    key, value = _repeat_kv(key, query.shape[1]), _repeat_kv(value, query.shape[1])
    scores = (query.float() @ key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    if causal:
        q_len, k_len = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).triu(1),
                                    float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # a row with no key: weights 0
    return (weights @ value.float()).to(query.dtype), lse.nan_to_num(0.0, neginf=0.0)


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)
