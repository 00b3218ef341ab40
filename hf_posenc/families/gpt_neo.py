"""GPT-Neo: GPT-2's `wpe`, plus a causal mask buffer per attention layer (banded in the local layers)
sized by the context, which grows with the table."""

import torch

from .learned_tables import GrowingBuffer, TableSpec, register_learned_families


def causal_mask(attention, length: int, old: torch.Tensor) -> torch.Tensor:
    """The layer's mask at `length`: lower triangle, minus what lies beyond the window in local layers."""
    mask = torch.ones(length, length, dtype=torch.bool, device=old.device).tril()
    if attention.attention_type == "local":
        mask = mask ^ mask.tril(-attention.config.window_size)
    return mask.view(1, 1, length, length)


GPT_NEO = TableSpec(
    name="gpt_neo", model_types=("gpt_neo",), tables=("wpe",),
    buffers=(GrowingBuffer("h.*.attn.attention", "bias", causal_mask),), guard_at="",
)

register_learned_families(GPT_NEO)
