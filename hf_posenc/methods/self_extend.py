"""Self-Extend (Jin et al., 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning").

With c the context the model was trained on, G the group size and W the neighbour window, a query at
position i and a key at position j <= i are
- neighbours when i - j < W: the true positions (RoPE as the model was trained);
- grouped otherwise: the key at floor(j / G), the query at floor(i / G) + W - floor(W / G), so the grouped
  distance floor(i / G) - floor(j / G) + W - floor(W / G) continues the neighbour distances at i - j = W.
The two are merged as one softmax over all keys (log-sum-exp merge). An input of at most W tokens is all
neighbours: the model as it was. The shift W - floor(W / G) is that of the authors' eager Llama file (LongLM,
transformers 4.40); their other Llama file and flash prefill use W - W / G, which differs only when G does not
divide W (Hamlet, 4096 tokens, G = 3, W = 512: perplexity 33.70923 here against 33.70700 with W / G).

Position ids other than the token order (a PoSE window's spread ids, strictly increasing) are read as the
positions: neighbours are the keys whose ids lie within W of the query's, the others grouped at their ids // G;
a fine-tune's Self-Extend teacher sees a training window at the student's ids (hf_posenc/train/losses.py).

The largest grouped query position is floor((L - 1) / G) + W - floor(W / G), which must stay < c: the
longest input is L = G * (c - W + floor(W / G)) (the paper's (c - W) * G + W when G divides W).

Defaults: W = c / 4 (1024 for Llama 2's 4096: the authors advise 512 to 1536 for it and use 1024 in their
examples), G = the smallest group that reaches the target context (their advice: smaller groups keep
positions more precise).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import Contract, Refused, check_number, register_method
from ..errors import InvalidParameterError, SequenceTooLongError
from . import remapped
from .remapped import Part, RemappedAttention, RemappedConfig, split


def longest_input(group_size: int, window: int, original: int) -> int:
    """The longest input Self-Extend keeps inside the original context: G * (c - W + floor(W / G))."""
    return group_size * (original - window + window // group_size)


def _check_length(length: int, group_size: int, window: int, original: int) -> None:
    longest = longest_input(group_size, window, original)
    if length > longest:
        raise SequenceTooLongError(
            f"input of {length} tokens is longer than Self-Extend supports with group_size={group_size}, "
            f"window={window} on an original context of {original}: at most {longest} tokens. "
            f"Patch with a larger group_size")


@register_method
@dataclass
class SelfExtendConfig(RemappedConfig):
    """Self-Extend: true positions within `window` tokens (default original / 4), grouped positions
    floor(i / group_size) beyond it. Give `group_size`, or a target context (max_position_embeddings= /
    factor=) and the smallest group that reaches it is used; the target may not pass the longest input the
    group supports, G * (original - window + floor(window / G))."""

    name: ClassVar[str] = "self_extend"
    summary: ClassVar[str] = "Self-Extend: neighbour positions within a window, grouped positions floor(i/G) beyond"
    # llama.cpp's group attention (llama-completion's --grp-attn-n / --grp-attn-w) is another mapping: it divides
    # the cached positions of whole blocks of --grp-attn-w keys as the blocks fill and moves the query back with
    # them, so no key keeps its true distance past the block being filled (tests/test_serving.py compares the two)
    export_refusal: ClassVar[str | None] = (
        "it changes the attention computation itself. llama.cpp's group attention (--grp-attn-n / --grp-attn-w, "
        "llama-completion only) is a different mapping: it groups whole blocks of --grp-attn-w keys as they fill, "
        "with no window of true distances around each query and another query position, so no flags give this "
        "patch")
    contract: ClassVar[Contract] = Contract(
        examples=({"group_size": 4}, {}),
        refused=(Refused({"group_size": 0}, "group_size must be >= 1"), Refused({}, "needs group_size="),
                 Refused({"group_size": 2, "window": 10**6}, "must be smaller than the model's original context")),
        unchanged_within=0.25,  # the default window: original / 4
        unchanged_tolerance=1e-5,  # neighbours and grouped keys merged by log-sum-exp: equal to float precision
        reference="tests/test_self_extend.py::test_self_extend_matches_the_papers_position_matrices",
    )

    group_size: int | None = None
    window: int | None = None

    def length_limit(self, original: int) -> int | None:
        return longest_input(self.group_size, self.window, original) if self.group_size and self.window else None

    def check_length(self, length: int, original: int) -> None:
        if self.group_size and self.window:
            _check_length(length, self.group_size, self.window, original)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("group_size", self.group_size, minimum=1, integer=True)
        check_number("window", self.window, above=0, integer=True)

    def resolve(self, original: int) -> SelfExtendConfig:
        window = self.window if self.window is not None else max(1, original // 4)
        if window >= original:
            raise InvalidParameterError(
                f"window={window} must be smaller than the model's original context {original} (the neighbours "
                f"keep their true distances, which the model saw only below {original})")
        group = self.group_size
        if group is None:
            if self.max_position_embeddings is None and self.factor is None:
                raise InvalidParameterError(
                    "method 'self_extend' needs group_size= (an int >= 1) or a target context, "
                    "max_position_embeddings= / factor=, from which the smallest group is chosen")
            target = super().resolve(original).max_position_embeddings
            # longest_input(G) lies in [G (c - W), G (c - W) + W]: no smaller G reaches the target than this
            group = max(1, -(-(target - window) // (original - window)))
            while longest_input(group, window, original) < target:
                group += 1
        longest = longest_input(group, window, original)
        if self.max_position_embeddings is None and self.factor is None:
            resolved = dataclasses.replace(self, max_position_embeddings=longest, factor=longest / original)
        else:
            resolved = super().resolve(original)
        if resolved.max_position_embeddings > longest:
            raise InvalidParameterError(
                f"max_position_embeddings={resolved.max_position_embeddings} is longer than Self-Extend supports with "
                f"group_size={group}, window={window} on an original context of {original}: at most {longest} tokens "
                f"(G * (original - window + window // G)); raise group_size or lower the target")
        return dataclasses.replace(resolved, group_size=int(group), window=int(window))

    def computation(self, rotary: torch.nn.Module, original: int) -> SelfExtendAttention:
        return SelfExtendAttention(rotary, original, self.group_size, self.window)

    @classmethod
    def variant_defaults(cls, params: dict, target: int, info: dict) -> dict:
        """A variant that gives group_size= runs that group: its longest input is then its context."""
        return dict(params) if "group_size" in params else super().variant_defaults(params, target, info)


class SelfExtendAttention(RemappedAttention):
    reads_position_ids = True

    def __init__(self, rotary: torch.nn.Module, original: int, group_size: int, window: int):
        super().__init__(rotary, original)
        self.group_size, self.window = group_size, window
        self.longest = longest_input(group_size, window, original)

    def check_length(self, length):
        _check_length(length, self.group_size, self.window, self.original)

    def key_positions(self, length, device):
        positions = torch.arange(length, device=device)
        return {"true": positions, "grouped": positions // self.group_size}

    def blocks(self, first, end):
        """Blocks of twice the usual queries where the window is wider than that. Each block makes three
        triangular kernel calls (the band's two ends, the grouped staircase), which cost about the same per
        query at any block size, while the CPU flash kernel runs blocks of 768 queries or more in larger tiles:
        at 16384 tokens the attention takes 1.15x the unpatched causal call instead of 1.35x (RESULTS.md).
        A block no longer than the window keeps every part unmasked."""
        size = 2 * remapped.QUERY_BLOCK
        if self.window <= size:
            return super().blocks(first, end)
        return [(a, min(a + size, end)) for a in range(first, end, size)]

    def parts(self, start, end, device):
        G, W = self.group_size, self.window
        positions = torch.arange(start, end, device=device)
        size = end - start
        zero = torch.zeros_like(positions)
        # neighbours: keys i - W < j <= i; a band, masked only over its first `size` keys
        first = max(0, start - W + 1)
        parts = [Part("true", positions, "true", a, e, positions - W + 1, positions)
                 for a, e in split(first, end, start - W + 1 + size, start)]
        # grouped: keys j <= i - W, all of them before start - W, a causal staircase after
        grouped = positions // G + W - W // G
        parts += [Part("grouped", grouped, "grouped", a, e, zero, positions - W)
                  for a, e in split(0, max(0, end - W), start - W)]
        return parts

    def spread_key_positions(self, positions):
        return {"true": positions, "grouped": positions // self.group_size}

    def spread_parts(self, start, end, positions):
        """The same two parts from the ids: query i's neighbours are the keys from the first whose id lies within
        W of its own (a band of varying width), the keys before them grouped."""
        G, W = self.group_size, self.window
        at = positions[start:end]
        rows = torch.arange(start, end, device=positions.device)
        near = torch.searchsorted(positions, at - W + 1)   # the first key within W of each query
        parts = [Part("true", at, "true", int(near.min()), end, near, rows)]
        if int(near.max()) > 0:
            parts.append(Part("grouped", at // G + W - W // G, "grouped", 0, int(near.max()), torch.zeros_like(near),
                              near - 1))
        return parts

    def extra_repr(self) -> str:
        return f"group_size={self.group_size}, window={self.window}, original={self.original}"
