"""What the hardware runs a training run with: the attention implementation ("auto": flash_attention_2 where it is
installed on a GPU, else sdpa) and the mixed precision (bf16 where the hardware runs it natively)."""

from __future__ import annotations

import importlib.util

import torch


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
