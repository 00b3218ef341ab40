"""What trains in a fine-tune: parameter groups or regexes left trainable (the rest frozen), LoRA adapters
(peft; LongLoRA's embeddings and norms may train beside them), dropout off where a deterministic target is
matched; what the objective never reaches, frozen. Plain Python at import (torch and peft load inside the calls): a
recipe's --help reads GROUPS."""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch


# the groups train.trainable names, as regexes over parameter names
GROUPS = {
    "embeddings": r"embed|wte|wpe|position|word_embeddings|token_type",
    "norms": r"norm|ln_|layernorm",
    "attention": r"attn|attention|q_proj|k_proj|v_proj|o_proj",
    "mlp": r"mlp|intermediate|\.output\.dense|fc\d|gate_proj|up_proj|down_proj",
    "head": r"lm_head|score|classifier",
}


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
    import torch

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


def freeze_unreached(objective: torch.nn.Module, device, probe: dict, teacher=None, tokens: int = 16) -> list[str]:
    """Freeze the trainable parameters the objective's loss never depends on (an encoder's pooler under
    distill, which matches hidden states; a head the loss does not use), found by one forward and backward
    on the first `tokens` tokens of a training block; returns their names. Nothing changes in what trains:
    AdamW and gradient clipping skip a parameter without a gradient, so one process leaves them as they are,
    and frozen, DDP leaves them too instead of stopping at the second step ("Parameter indices which did
    not receive grad"). The RNG state (dropout) is restored and the gradients cleared afterwards.
    Models whose use of parameters depends on the data (routed experts) are not probed: DDP looks for
    unused parameters at every step there (Preflight.routed_experts)."""
    import torch

    objective.to(device)
    ids, mask = (probe[k][:, :tokens].to(device) for k in ("input_ids", "attention_mask"))
    trainable = [(n, p) for n, p in objective.named_parameters() if p.requires_grad]
    with torch.random.fork_rng(devices=[]):
        objective(ids, mask, teacher=teacher).backward()
    unreached = [n.removeprefix("model.") for n, p in trainable if p.grad is None]
    for n, p in trainable:
        if p.grad is None:
            p.requires_grad_(False)
        p.grad = None
    return unreached
