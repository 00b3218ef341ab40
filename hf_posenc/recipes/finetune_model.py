"""The model the fine-tune recipe trains: loaded with the attention implementation and precision the
hardware runs, the parameters that train (groups, regexes, LoRA adapters), dropout off for distillation."""

from __future__ import annotations

import importlib.util
import re
import warnings

from typing import TYPE_CHECKING

import torch

from .. import loading
from ..errors import ConfigError
from .recipe_config import one_line
from .finetune_config import GROUPS

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


def select_trainable(model: torch.nn.Module, spec) -> tuple[int, int]:
    """Freeze what `spec` does not name ("all", or groups / regexes); never unfreezes what is frozen
    (a patch's fixed positions stay fixed). Returns (trainable, total) parameter counts."""
    if spec != "all":
        names = [spec] if isinstance(spec, str) else list(spec)
        pattern = re.compile("|".join(f"(?:{GROUPS.get(n, n)})" for n in names), re.IGNORECASE)
        for name, p in model.named_parameters():
            if not pattern.search(name):
                p.requires_grad_(False)
    params = list(model.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    if trainable == 0:
        raise ConfigError(f"train.trainable={spec!r} leaves no parameter to train")
    return trainable, sum(p.numel() for p in params)


def disable_dropout(model: torch.nn.Module) -> None:
    """For distill: its target is deterministic, and dropout noise in the student only blurs the match
    (MiniLM healing: 0.87 with dropout, 0.94 without, same steps). The saved config keeps its dropout."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):   # Llama-like attention
            module.attention_dropout = 0.0


def apply_lora(model: torch.nn.Module, lora: dict, trainable) -> torch.nn.Module:
    """LoRA adapters (peft) on `target_modules`; with `trainable` other than "all", those parameters
    train too (LongLoRA trains embeddings and norms alongside the adapters)."""
    import peft

    lora_config = peft.LoraConfig(r=int(lora.get("r", 8)), lora_alpha=int(lora.get("alpha", 16)),
                                  lora_dropout=float(lora.get("dropout", 0.0)),
                                  target_modules=lora.get("target_modules", "all-linear"))
    extra = [] if trainable == "all" else [n for n, p in model.named_parameters() if p.requires_grad]
    with warnings.catch_warnings():   # peft reads transformers' deprecated `is_gradient_checkpointing` alias
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = peft.get_peft_model(model, lora_config)
    if extra:
        pattern = re.compile("|".join(f"(?:{GROUPS.get(n, n)})" for n in
                                      ([trainable] if isinstance(trainable, str) else trainable)), re.IGNORECASE)
        for name, p in model.named_parameters():
            if pattern.search(name) and "lora_" not in name and not name.endswith("original_module"):
                p.requires_grad_(True)
    return model
