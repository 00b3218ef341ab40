"""Learned position tables: how each family's model calls its table, the bounded table module that refuses,
with a clear error, an input longer than it, and `GrownTableConfig`, what the methods that make a longer
learned table (interpolate.py, tile.py, hierarchical.py) share: each only says how to compute the rows.

A table has `offset` rows below position 0 (OPT and BART: 2; RoBERTa: padding_idx + 1, the row
padding tokens read): row r holds position r - offset. Those rows are carried over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import METHODS, LearnedMethodConfig
from ..errors import SequenceTooLongError

# How a family's model calls its table (the same signature for every style):
#   "ids":    table(row_ids), like nn.Embedding (GPT-2, GPT-Neo, BERT, RoBERTa, DistilBERT ...)
#   "mask":   table(attention_mask, past_key_values_length, position_ids=None) (OPT, BioGPT)
#   "arange": table(input_ids, past_key_values_length, position_ids=None) (BART, mBART, PLBart)
CALL_STYLES = ("ids", "mask", "arange")


def table_rows(call: str, offset: int, input: torch.Tensor, past_key_values_length: int = 0,
               position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The table rows a family's model reads for one call (see CALL_STYLES)."""
    if call == "ids":
        return input
    if position_ids is None:
        if call == "mask":
            # only attended tokens advance the position; padding reads position -1
            counts = torch.cumsum(input, dim=1)
            position_ids = (counts * input - 1).long()[:, past_key_values_length:]
        else:
            batch, length = input.shape[:2]
            position_ids = torch.arange(past_key_values_length, past_key_values_length + length,
                                        device=input.device).expand(batch, -1)
    elif call == "arange":
        position_ids = position_ids.unsqueeze(0)  # BART's table takes one row of positions
    return position_ids + offset


def too_long_message(length: int, limit: int, method: str | None) -> str:
    """The message of SequenceTooLongError: the length, the limit, and the methods that lift it.
    `method` is the hf_posenc method that made the table, None for the model's own table."""
    owner = "this model's learned position table" if method is None else f"the table hf_posenc's {method!r} made"
    # the registered table methods: those whose table has no last position, and those that grow a longer one
    tables = sorted((name, cls) for name, cls in METHODS.items() if issubclass(cls, LearnedMethodConfig))
    unbounded = [name for name, cls in tables if cls.unbounded]
    grown = [name for name, cls in tables if issubclass(cls, GrownTableConfig)]
    lift = (f"{' or '.join(f'hp.patch(model, {name!r}, max_position_embeddings=...)' for name in unbounded)} has no "
            f"length limit; {' or '.join(map(repr, grown))} with max_position_embeddings >= {length} make a longer "
            f"learned table")
    if method is not None:
        lift = "call hp.unpatch(model), then " + lift
    return (f"an input of {length} tokens is longer than {owner}, which holds {limit} positions (0..{limit - 1}); "
            f"{lift}")


def check_rows(rows: torch.Tensor, num_rows: int, offset: int, method: str | None) -> None:
    """Refuse rows past the end of a table of `num_rows` rows (`method` as in too_long_message)."""
    if rows.numel() and (last := int(rows.max())) >= num_rows:
        raise SequenceTooLongError(too_long_message(last - offset + 1, num_rows - offset, method))


class LearnedPositions(nn.Embedding):
    """A learned position table (trainable) that the family's model calls as it called its own, and
    that says clearly when an input is longer than it. Saved as `weight`, like the family's table."""

    def __init__(self, weight: torch.Tensor, *, offset: int, call: str, padding_idx: int | None, method: str):
        super().__init__(weight.shape[0], weight.shape[1], padding_idx=padding_idx, _weight=weight,
                         device=weight.device, dtype=weight.dtype)
        self.offset, self.call, self.method = offset, call, method

    @property
    def limit(self) -> int:
        """The number of positions it holds."""
        return self.num_embeddings - self.offset

    def forward(self, input: torch.Tensor, past_key_values_length: int = 0,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        rows = table_rows(self.call, self.offset, input, past_key_values_length, position_ids)
        check_rows(rows, self.num_embeddings, self.offset, self.method)
        return super().forward(rows)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, offset={self.offset}, call={self.call!r}, method={self.method!r}"


ORIGINAL_TABLE = "original_table"  # NoPositions' copy of the table it replaced, saved with the checkpoint


class NoPositions(nn.Module):
    """In place of a learned table when positions move into attention (ALiBi, relative bias, RoPE):
    adds nothing. It keeps an empty `weight` ([0, dim]) under the table's name, so stock transformers
    refuses the saved checkpoint (a size mismatch on the table) instead of loading a model whose
    positions are silently missing, and the table it replaced as `original_table` (unused, and saved), so
    `hp.unpatch` of a model `hp.from_pretrained` loaded gives the original table back, bit for bit."""

    def __init__(self, like: nn.Embedding, *, offset: int, call: str):
        super().__init__()
        self.offset, self.call = offset, call
        self.register_buffer("weight", like.weight.detach().new_zeros(0, like.weight.shape[1]))
        self.register_buffer(ORIGINAL_TABLE, like.weight.detach())

    @property
    def limit(self) -> None:
        """No limit on the number of positions."""
        return None

    def forward(self, input: torch.Tensor, past_key_values_length: int = 0,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        rows = table_rows(self.call, self.offset, input, past_key_values_length, position_ids)
        return self.weight.new_zeros(*rows.shape, self.weight.shape[1])

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[1]}, call={self.call!r}"


@dataclass
class GrownTableConfig(LearnedMethodConfig):
    """A longer learned table (trainable afterwards) whose rows a method computes from the old ones: the
    table module is a `LearnedPositions`, saved as a plain table that stock transformers loads."""

    def grow(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        """`length` rows from the `rows` of positions 0 .. n - 1 of the old table."""
        raise NotImplementedError

    def build_table(self, old: nn.Embedding, *, offset: int, positions: int, call: str) -> tuple[nn.Module, dict]:
        weight = old.weight.detach()
        grown = self.grow(weight[offset: offset + positions], self.max_position_embeddings)
        module = LearnedPositions(torch.cat([weight[:offset], grown]), offset=offset, call=call,
                                  padding_idx=old.padding_idx, method=self.name)
        return module, {}

    def restore_table(self, stock: nn.Embedding, *, offset: int, call: str, info: dict,
                      saved: dict[str, torch.Tensor]) -> nn.Module:
        module = LearnedPositions(stock.weight.detach(), offset=offset, call=call, padding_idx=stock.padding_idx,
                                  method=self.name)
        module.weight = stock.weight  # the loaded parameter itself
        return module
