"""What the hardware runs a training run with: the attention implementation ("auto": flash_attention_2 where it is
installed on a GPU, else sdpa, each where the model's class runs it) and the mixed precision (bf16 where the hardware
runs it natively)."""

from __future__ import annotations

import importlib.util

import torch


# the flag a transformers model class sets for each implementation it runs
SUPPORT_FLAGS = {"flash_attention_2": "_supports_flash_attn", "sdpa": "_supports_sdpa"}


def choose_attention(requested: str, config=None, flash: bool = True) -> str:
    """`requested`, or for "auto" flash_attention_2 on a GPU where it is installed (unless `flash` is False: the
    recipes' plain passes), else sdpa: each only where the causal-LM class of `config` (when given) runs it, else
    eager (Gemma 2 soft-caps its scores: no sdpa)."""
    if requested != "auto":
        return requested
    gpu_flash = flash and torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None
    ladder = ["flash_attention_2"] if gpu_flash else []
    return next((impl for impl in [*ladder, "sdpa"] if config is None or runs_attention(config, impl)), "eager")


def runs_attention(config, implementation: str) -> bool:
    """Whether the causal-LM class transformers builds for `config` runs `implementation` (True where unknown)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return True
    return bool(getattr(cls, SUPPORT_FLAGS[implementation], True)) if implementation in SUPPORT_FLAGS else True


def mixed_precision(dtype: str) -> str:
    """bf16 mixed precision where the hardware runs it natively (auto: a GPU with bf16, or a CPU with
    AVX512-BF16 / AMX, where it is ~2x faster than float32; emulated elsewhere, ~3.7x slower), else full
    precision."""
    from .._compat import native_bfloat16

    if dtype == "auto" and native_bfloat16()[0]:
        return "bf16"
    return "no"
