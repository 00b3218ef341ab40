"""Dual Chunk Attention (An et al., 2024, "Training-Free Long-Context Scaling of Large Language Models").

With c the context the model was trained on, s the chunk size and w the local window (s + w <= c), the
keys sit at position j mod s and a query i of chunk n = floor(i / s), r = i mod s, attends
- intra-chunk: to the keys of its own chunk, the query at position r (the true distances, < s);
- successive-chunk: to the keys of chunk n - 1, the query at the paper's P_q^Succ = [s, s + 1, ..., s + w - 1,
  c - 1, ..., c - 1]: the first w queries of a chunk keep their true distance to the previous chunk (the
  tokens just before the boundary stay neighbours), the others sit at c - 1;
- inter-chunk: to the keys of chunks 0 .. n - 2, the query at P_q^Inter = c - 1.
Every query and key position is < c, so every relative distance is one the model saw in training, at any
input length. The three parts are merged as one softmax over all keys (log-sum-exp merge). An input of at
most s tokens is one chunk: the model as it was.

Defaults: w = c / 16 and s = c - w. c / 16 is the local window the authors' released code (ChunkLlama's
`replace_with_chunkllama`) first took (256 for Llama 2's 4096); s = c - w is the largest chunk whose
successive-chunk positions s + w - 1 stay < c. Since 2024-04 that code takes w = c / 8, smaller chunks
s = 3c / 4 - w, places the successive and inter-chunk queries at 3c / 4 (`min(r + chunk_len, chunk_size)`)
instead of c - 1, and multiplies q and k by 0.05 ln(L / c) + 1 once an input of L tokens is longer than c.
Here every position follows the paper, with no such scaling; benchmarks/bench_dca_chunks.py runs the released
sizes beside the defaults (benchmarks/RESULTS.md: on Hamlet at 4x SmolLM2's context the two score alike).

DCA keeps the checkpoint's own RoPE, so it is not stacked on a frequency method (ntk, yarn, ...): hp.patch
refuses a model that is already patched. A checkpoint that ships a static scaling (yarn, llama3, ...) keeps
it: its rotary module gives the cos / sin.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import Contract, Refused, check_number, register_method
from ..errors import InvalidParameterError
from .remapped import Part, RemappedAttention, RemappedConfig, split


@register_method
@dataclass
class DcaConfig(RemappedConfig):
    """Dual Chunk Attention: chunks of `chunk_size` tokens (default the original context minus the local
    window), positions re-used in every chunk; `local_window` (default original / 16) tokens before a chunk
    keep their true distance. Any input length; max_position_embeddings only sets the advertised context."""

    name: ClassVar[str] = "dca"
    # vLLM built Dual Chunk Attention from a config's dual_chunk_attention_config for Qwen2 / Qwen2-MoE / Qwen3 /
    # Qwen3-MoE up to 0.10 (V0 engine, the DUAL_CHUNK_FLASH_ATTN backend), and multiplied the logits by a length
    # scale of its own; 0.11 removed it. docs/serving.md says more.
    export_refusal: ClassVar[str | None] = (
        "it changes the attention computation itself. vLLM read dual_chunk_attention_config only up to 0.10 (V0 "
        "engine, DUAL_CHUNK_FLASH_ATTN backend, model types qwen2, qwen2_moe, qwen3, qwen3_moe) and scaled the "
        "logits by max(1, 0.1 ln(length / original) + 1) besides, which this patch does not; no current vLLM or "
        "llama.cpp runs Dual Chunk Attention")
    summary: ClassVar[str] = "Dual Chunk Attention: intra / successive / inter-chunk positions < original, any length"
    contract: ClassVar[Contract] = Contract(
        examples=({}, {"chunk_size": 40, "local_window": 8}),
        refused=(Refused({"chunk_size": 0}, "chunk_size must be > 0"),
                 Refused({"chunk_size": 10**6}, "above the model's original context"),
                 Refused({"chunk_size": 16, "local_window": 16}, "must be smaller than chunk_size")),
        unchanged_within=0.9,  # the default chunk: the original context less original / 16
        reference="tests/test_dca.py::test_dca_matches_the_papers_position_matrices",
    )

    chunk_size: int | None = None
    local_window: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("chunk_size", self.chunk_size, above=0, integer=True)
        check_number("local_window", self.local_window, above=0, integer=True)

    def resolve(self, original: int) -> DcaConfig:
        resolved = super().resolve(original)
        window = self.local_window if self.local_window is not None else max(1, original // 16)
        chunk = self.chunk_size if self.chunk_size is not None else original - window
        if chunk > original:
            raise InvalidParameterError(
                f"chunk_size={chunk} is above the model's original context {original}; it must be <= {original}")
        if window >= chunk:
            raise InvalidParameterError(
                f"local_window={window} must be smaller than chunk_size={chunk} (the window is the part of the "
                f"previous chunk that keeps its true distance)")
        if chunk + window > original:
            raise InvalidParameterError(
                f"chunk_size + local_window = {chunk} + {window} = {chunk + window} is above the model's original "
                f"context {original}: the successive-chunk positions reach chunk_size + local_window - 1; give "
                f"chunk_size <= {original - window} or local_window <= {original - chunk}")
        return dataclasses.replace(resolved, chunk_size=int(chunk), local_window=int(window))

    def computation(self, rotary: torch.nn.Module, original: int) -> DualChunkAttention:
        return DualChunkAttention(rotary, original, self.chunk_size, self.local_window)


class DualChunkAttention(RemappedAttention):
    def __init__(self, rotary: torch.nn.Module, original: int, chunk_size: int, local_window: int):
        super().__init__(rotary, original)
        self.chunk_size, self.local_window = chunk_size, local_window

    def key_positions(self, length, device):
        return {"chunk": torch.arange(length, device=device) % self.chunk_size}

    def blocks(self, first, end):
        """One block per chunk: its parts need no mask (whole key ranges and the causal diagonal), so the
        kernel calls can be as long as a chunk."""
        s = self.chunk_size
        return split(first, end, *range((first // s + 1) * s, end, s))

    def parts(self, start, end, device):
        s, w, c = self.chunk_size, self.local_window, self.original
        positions = torch.arange(start, end, device=device)
        chunk = start // s * s  # the first position of the block's chunk
        offset = positions - chunk  # i mod s
        zero = torch.zeros_like(positions)
        parts = [Part("intra", offset, "chunk", a, e, zero + chunk, positions) for a, e in split(chunk, end, start)]
        if chunk >= s:
            successive = torch.where(offset < w, s + offset, c - 1)
            parts.append(Part("successive", successive, "chunk", chunk - s, chunk, zero, positions))
        if chunk >= 2 * s:
            parts.append(Part("inter", zero + c - 1, "chunk", 0, chunk - s, zero, positions))
        return parts

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}, local_window={self.local_window}, original={self.original}"
