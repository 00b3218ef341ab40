"""The model the fine-tune recipe trains, loaded with the attention implementation and precision the hardware
runs, and its tokenizer (what trains of it: hf_posenc/train/trainable.py)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch

from .. import loading
from ..errors import ConfigError
from ..errors import one_line

if TYPE_CHECKING:
    from .finetune_config import FinetuneConfig, ModelArgs


def _model_ref(model: ModelArgs) -> str:
    from ..assets import resolve_alias

    return resolve_alias(model.name)


def choose_attention(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def mixed_precision(dtype: str) -> str:
    """bf16 mixed precision where the hardware runs it natively (auto: a GPU with bf16, or a CPU with
    AVX512-BF16 / AMX, where it is ~2x faster than float32; emulated elsewhere, ~3.7x slower), else full
    precision."""
    from .._compat import native_bfloat16

    if dtype == "auto" and native_bfloat16()[0]:
        return "bf16"
    return "no"


def load_model(cfg: FinetuneConfig):
    kwargs = {"attn_implementation": choose_attention(cfg.model.attn_implementation)}
    if cfg.model.dtype != "auto":
        kwargs["dtype"] = getattr(torch, cfg.model.dtype)
    return loading.load_model(_model_ref(cfg.model), gguf_file=cfg.model.gguf_file, **kwargs)


def load_tokenizer(cfg: FinetuneConfig):
    ref = _model_ref(cfg.model)
    try:
        return loading.load_tokenizer(ref, gguf_file=cfg.model.gguf_file)
    except (OSError, ValueError) as err:   # no tokenizer files beside the model, a backend missing, ...
        raise ConfigError(f"cannot load the tokenizer of {ref!r}: {one_line(err)}") from None
