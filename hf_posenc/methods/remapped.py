"""Attention whose RoPE positions depend on the query as well as the key (Dual Chunk Attention,
Self-Extend): the shared machinery.

Such a method splits each query's keys into parts; each part rotates the query and the keys at the
positions the method gives them, runs one SDPA kernel call that also returns the log-sum-exp of the scores
(`_compat.attention_with_lse`), and the parts are merged as one softmax over all keys:
out = sum_p exp(lse_p - lse) out_p with lse = log sum_p exp(lse_p). No L x L tensor: queries go in blocks,
a part's keys are a contiguous range, and a part that only some queries of a block see gets a float mask
of (block x range) entries; the common parts need no mask or the kernel's own causal one.

The kernel takes q, k and v in one dtype: under autocast the autocast dtype, as torch's SDPA casts them for
the unpatched model (whose q and k reach it in float32 there, rotated by float32 cos / sin, and v in bfloat16),
so the patched model runs the same fused kernel at the same precision. Where the float32 reference runs
instead (while autograd records, or a device without the kernel), the calls are counted in `fallbacks` and a
warning names the reason once per model.

The model's rotary module is replaced by `NoRotation`, so q and k reach the attention call, and the KV
cache, un-rotated; the method rotates them with cos / sin read from the model's original rotary module
(a table of the positions it needs, shared by every layer). Positions count the tokens a row attends to:
a left-padded row is attended exactly as the same row alone. Position ids other than that count (a PoSE window's
spread ids, no cache, no padding) are read by a method that can place its parts by them (`reads_position_ids`:
Self-Extend) and refused by the others, never dropped.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import nn

from .. import _compat
from ..attention import AttentionMethodConfig, AttentionSite, PositionalAttention
from ..errors import InvalidInputError, InvalidParameterError, MethodNotApplicableError, ParameterTypeError
from .rope import apply_rotary

QUERY_BLOCK = 512  # queries per kernel call: a masked part costs at most this many rows x its keys


class Part(NamedTuple):
    """Keys start .. end - 1 (rotated as `keys`: a name of `key_positions`) seen by a block of queries
    rotated at `query_positions`; query i of the block sees the keys t with lo[i] <= t <= hi[i]."""
    query: str  # a name for the query rotation: parts that share it rotate the queries once
    query_positions: torch.Tensor  # [block]
    keys: str
    start: int
    end: int
    lo: torch.Tensor  # [block]
    hi: torch.Tensor  # [block]


def split(start: int, end: int, *cuts: int) -> list[tuple[int, int]]:
    """The non-empty ranges [start, end) is cut into at `cuts`."""
    points = sorted({start, end, *(c for c in cuts if start < c < end)})
    return [(a, b) for a, b in zip(points, points[1:]) if a < b]


class RemappedAttention(nn.Module):
    """One module shared by every attention layer of a model. Subclasses give `key_positions`, `blocks`,
    `parts` and `check_length`; positions in them are the token positions 0 .. L - 1 of one row. One that sets
    `reads_position_ids` also gives `spread_key_positions` and `spread_parts`, the same from a row's own ids."""

    reads_position_ids: ClassVar[bool] = False

    def __init__(self, rotary: nn.Module, original: int):
        super().__init__()
        self.rotary = rotary  # the model's own rotary module, as it was before the patch
        self.original = original  # the context the model was trained on: every relative distance stays below it
        self._table: tuple | None = None
        self._gathers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._gathers_for: tuple | None = None  # the input they belong to: (q_len, k_len, the table's key)
        self.fallbacks: Counter[str] = Counter()  # reason -> kernel calls that ran the float32 reference

    # -- what a method defines -------------------------------------------------------------------------

    def key_positions(self, length: int, device: torch.device) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def blocks(self, first: int, end: int) -> list[tuple[int, int]]:
        """Query blocks covering positions first .. end - 1."""
        return [(a, min(a + QUERY_BLOCK, end)) for a in range(first, end, QUERY_BLOCK)]

    def parts(self, start: int, end: int, device: torch.device) -> list[Part]:
        raise NotImplementedError

    def check_length(self, length: int) -> None:
        """Refuse an input this method cannot attend over."""

    def spread_key_positions(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """`key_positions` of keys at the ids `positions` (strictly increasing)."""
        raise NotImplementedError

    def spread_parts(self, start: int, end: int, positions: torch.Tensor) -> list[Part]:
        """`parts` of the queries start .. end - 1 (indices into the row) when the row's ids are `positions`."""
        raise NotImplementedError

    # -- the attention call ----------------------------------------------------------------------------

    def forward(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0, **kwargs):
        """transformers' attention-function contract: q [b, heads, q, d], k / v [b, kv_heads, k, d] (the
        cache included, un-rotated), the model's mask; returns ([b, q, heads, d], None)."""
        if dropout and module.training:
            raise MethodNotApplicableError(
                f"{type(self).__name__} has no attention dropout; set the model's attention_dropout to 0 for training")
        q_len, k_len = query.shape[-2], key.shape[-2]
        end, valid = _attended_keys(attention_mask, query.shape[0], q_len, k_len)
        if end < k_len:  # a static cache: its slots past the queries are not filled yet
            key, value, k_len = key[..., :end, :], value[..., :end, :], end
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        if valid is None:
            ids = self.given_ids(kwargs.get("position_ids"), query.shape[0], q_len, k_len)
        else:
            ids = self.padded_ids(kwargs.get("position_ids"), valid, q_len, k_len)
        if ids is not None and valid is None:   # each row at its own ids (a batch of PoSE windows draws them per row)
            out = torch.cat([self.attend(query[row:row + 1], key[row:row + 1], value[row:row + 1], scale, ids[row])
                             for row in range(query.shape[0])])
        elif valid is None:
            out = self.attend(query, key, value, scale)
        else:  # padding: each row alone, its positions counted over the tokens it attends to
            out = query.new_zeros(*query.shape[:-1], value.shape[-1], dtype=kernel_dtype(query, key, value))
            for row in range(query.shape[0]):
                keys = valid[row].nonzero().squeeze(1)
                queries = valid[row, k_len - q_len:].nonzero().squeeze(1)  # always the last of the row's keys
                if len(queries):
                    one = slice(row, row + 1)
                    out[one, :, queries] = self.attend(query[one, :, queries], key[one, :, keys], value[one, :, keys],
                                                       scale, None if ids is None else ids[row])
        return out.transpose(1, 2).contiguous(), None

    def given_ids(self, position_ids, batch: int, q_len: int, k_len: int) -> torch.Tensor | None:
        """The ids [batch, K] of rows whose position ids are not their token order 0 .. K - 1 (None when every
        row's are): read by a method that `reads_position_ids`, refused otherwise, and with a KV cache (the
        cached keys' ids are not known here) or ids that do not increase."""
        if position_ids is None:
            return None
        ids = _row_ids(position_ids, batch, q_len)
        if torch.equal(ids, torch.arange(k_len - q_len, k_len, device=ids.device).expand_as(ids)):
            return None
        self._check_readable(ids, q_len, k_len)
        name = type(self).__name__
        if bool((ids[:, 0] < 0).any()) or bool((ids.diff(dim=-1) <= 0).any()):
            raise InvalidInputError(f"{name} reads position ids that start at 0 or above and strictly increase "
                                    f"along each row (a PoSE window's); got a row starting {ids[0, :6].tolist()}")
        return ids

    def _check_readable(self, ids: torch.Tensor, q_len: int, k_len: int) -> None:
        """Ids other than the token order: refused with a KV cache (the cached keys' ids are not known here) and
        by a method that does not read them."""
        name = type(self).__name__
        if q_len != k_len:
            raise MethodNotApplicableError(
                f"{name} was given position ids other than the token order with a KV cache of {k_len - q_len} "
                f"tokens: their ids are not known here. Run the whole input in one forward")
        if not self.reads_position_ids:
            raise MethodNotApplicableError(
                f"{name} places each key by its token order and cannot read other position ids (these start "
                f"{ids[0, :4].tolist()}); pass none, or use self_extend, which reads them")

    def padded_ids(self, position_ids, valid: torch.Tensor, q_len: int, k_len: int) -> list[torch.Tensor] | None:
        """With padding: each row's ids at the keys it attends to, where they are neither those keys counted in
        order (what generate passes for padded rows) nor the token order, pads included (what transformers passes
        when no ids are given): None then, each row's positions counted over its own tokens. Refused as
        `given_ids` refuses. The ids of padded slots are not read."""
        if position_ids is None:
            return None
        batch = valid.shape[0]
        ids = _row_ids(position_ids, batch, q_len)
        counted = (valid.cumsum(-1) - 1)[:, k_len - q_len:]   # each key's place among the row's attended keys
        queries = valid[:, k_len - q_len:]
        order = torch.arange(k_len - q_len, k_len, device=ids.device).expand_as(ids)
        if torch.equal(ids[queries], counted[queries]) or torch.equal(ids, order):
            return None
        self._check_readable(ids, q_len, k_len)
        rows = [ids[row][valid[row]] for row in range(batch)]
        for row in rows:
            if len(row) and (bool(row[0] < 0) or bool((row.diff() <= 0).any())):
                raise InvalidInputError(f"{type(self).__name__} reads position ids that start at 0 or above and "
                                        f"strictly increase along each row's tokens (a PoSE window's); got a row "
                                        f"starting {row[:6].tolist()}")
        return rows

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
               positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rows without padding: keys at positions 0 .. K - 1 (or at the ids `positions`, one row), queries the
        last Q of them. [b, heads, Q, d] (key / value keep their kv heads: the kernel groups them), in
        `kernel_dtype`."""
        q_len, k_len = query.shape[-2], key.shape[-2]
        length = k_len if positions is None else int(positions[-1]) + 1
        self.check_length(length)
        first = k_len - q_len
        dtype = kernel_dtype(query, key, value)  # q and k rotated in their own dtype, then cast: as SDPA does
        cos, sin = self.table(max(length, self.original), query)
        drawn = None if positions is None else tuple(positions.tolist())
        if self._gathers_for != (q_len, k_len, self._table[0], drawn):  # another input: other positions
            self._gathers, self._gathers_for = {}, (q_len, k_len, self._table[0], drawn)
        named = (self.key_positions(k_len, query.device) if positions is None
                 else self.spread_key_positions(positions))
        keys = {name: _rotate(key, *self.gathered(("keys", name), cos, sin, p)).to(dtype) for name, p in named.items()}
        value = value.to(dtype)
        outputs = []
        for start, end in self.blocks(first, k_len):
            queries, results = {}, []
            parts = self.parts(start, end, query.device) if positions is None else self.spread_parts(start, end,
                                                                                                   positions)
            for part in parts:
                if part.end <= part.start:
                    continue
                mask, causal, empty = _pattern(part, dtype)
                if bool(empty.all()):
                    continue
                if part.query not in queries:
                    block = query[..., start - first:end - first, :]
                    at = self.gathered((part.query, start, end), cos, sin, part.query_positions)
                    queries[part.query] = _rotate(block, *at).to(dtype)
                q = queries[part.query]
                k, v = keys[part.keys][..., part.start:part.end, :], value[..., part.start:part.end, :]
                if causal == "reversed":  # query i sees keys i .. end: causal once both orders are reversed
                    out, lse = _compat.attention_with_lse(q.flip(-2), k.flip(-2), v.flip(-2), causal=True, scale=scale,
                                                          on_fallback=self.fell_back)
                    out, lse = out.flip(-2), lse.flip(-1)
                else:
                    out, lse = _compat.attention_with_lse(q, k, v, mask=mask, causal=causal, scale=scale,
                                                          on_fallback=self.fell_back)
                results.append((out, lse.masked_fill(empty, float("-inf"))))
            outputs.append(merge(results))
        return torch.cat(outputs, dim=-2)

    def fell_back(self, reason: str) -> None:
        """Count a kernel call that ran the float32 reference; warn the first time for each reason."""
        if reason not in self.fallbacks:
            warnings.warn(
                f"{type(self).__name__} computes attention with the float32 reference, not the fused SDPA kernel: "
                f"{reason}. It is slower (a block's scores written out); the calls are counted in this model's "
                f"{type(self).__name__}.fallbacks. Said once per model and reason", RuntimeWarning, stacklevel=2)
        self.fallbacks[reason] += 1

    def gathered(self, key: tuple, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin at `positions` (named by `key`), gathered once for all the layers of a forward: they see
        the same input, so the same positions."""
        if key not in self._gathers:
            self._gathers[key] = (cos[positions], sin[positions])
        return self._gathers[key]

    def table(self, length: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [positions, rotary_dim] of positions 0 .. length - 1 from the model's rotary module,
        built once and shared by every layer (grown when an input needs more)."""
        key = (like.dtype, like.device, torch.is_inference_mode_enabled())
        if self._table is None or self._table[0] != key or self._table[1] < length:
            with torch.no_grad():
                cos, sin = self.rotary(like, torch.arange(length, device=like.device)[None])
            self._table = (key, length, cos[0], sin[0])
        return self._table[2], self._table[3]


def kernel_dtype(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.dtype:
    """The one dtype q, k and v go to the kernel in: the autocast dtype where autocast is on for their device
    (torch's SDPA casts its inputs to it), else the widest of theirs."""
    device = query.device.type
    tensors = (query, key, value)
    if torch.is_autocast_enabled(device) and all(t.dtype != torch.float64 for t in tensors):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)


def _row_ids(position_ids: torch.Tensor, batch: int, q_len: int) -> torch.Tensor:
    """The position ids [batch, q_len] of every row (one row given: the same for all), refused unless integers of
    that shape."""
    shape = tuple(getattr(position_ids, "shape", ()))
    if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() or position_ids.is_complex() \
            or position_ids.dtype == torch.bool or len(shape) != 2 or shape[0] not in (1, batch) or shape[1] != q_len:
        shapes = f"({batch}, {q_len})" + (f" or (1, {q_len})" if batch > 1 else "")
        raise InvalidInputError(f"position_ids must be integers of shape {shapes} for {batch} row(s) of {q_len} "
                                f"queries, got {getattr(position_ids, 'dtype', type(position_ids).__name__)} "
                                f"of shape {shape}")
    return position_ids.expand(batch, -1) if shape[0] == 1 else position_ids


def _attended_keys(mask: torch.Tensor | None, batch: int, q_len: int,
                   k_len: int) -> tuple[int, torch.Tensor | None]:
    """(end, valid): the queries are the keys end - q_len .. end - 1, and valid [batch, end] bool the keys
    each row attends to (None when every row attends to all of them).

    The last query of a causal model without a sliding window attends to every key of its row that counts,
    itself the last of them: a static cache hands the attention all its slots, those past the queries unfilled
    and masked, so the queries end where the last query's keys do (rows are left-padded, as generate pads:
    every row's last query is a token). Without a mask the keys end at the queries, or past them only in a
    prefill into an empty static cache (as transformers' sdpa reads a missing mask)."""
    if mask is None:
        return (q_len if 1 < q_len < k_len else k_len), None
    last = mask[:, 0, -1, :k_len]
    allowed = last if last.dtype == torch.bool else last > torch.finfo(last.dtype).min
    allowed = allowed.expand(batch, k_len)
    seen = allowed.any(0).nonzero()
    end = max(q_len, int(seen[-1]) + 1) if len(seen) else k_len
    allowed = allowed[:, :end]
    return end, (None if bool(allowed.all()) else allowed)


def _pattern(part: Part, dtype: torch.dtype) -> tuple[torch.Tensor | None, bool | str, torch.Tensor]:
    """(float mask or None, causal, rows that see no key) for a part: no mask where every query sees the
    whole range, the kernel's causal mask where the range is the block's own diagonal ("reversed" where
    query i sees keys i .. end of a range as long as the block: a band's first keys)."""
    lo, hi = part.lo.clamp(min=part.start), part.hi.clamp(max=part.end - 1)
    empty = lo > hi
    whole_start, whole_end = bool((part.lo <= part.start).all()), bool((part.hi >= part.end - 1).all())
    if whole_start and whole_end:
        return None, False, empty
    size = part.end - part.start
    diagonal = torch.arange(size, device=lo.device)
    if size == len(lo) and whole_start and torch.equal(part.hi - part.start, diagonal):
        return None, True, empty
    if size == len(lo) and whole_end and torch.equal(part.lo - part.start, diagonal):
        return None, "reversed", empty
    keys = torch.arange(part.start, part.end, device=lo.device)
    allowed = (keys >= lo[:, None]) & (keys <= hi[:, None])
    return torch.zeros(allowed.shape, dtype=dtype, device=lo.device).masked_fill(~allowed, float("-inf")), False, empty


def merge(results: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One softmax over the union of the parts' keys, from each part's output and log-sum-exp."""
    if len(results) == 1:
        return results[0][0]
    outs = torch.stack([out for out, _ in results])
    lses = torch.stack([lse for _, lse in results])
    weights = torch.exp(lses - torch.logsumexp(lses, dim=0)).nan_to_num(0.0)  # no key at all: 0
    return (outs.float() * weights[..., None]).sum(0).to(outs.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return apply_rotary(x, cos[None, None], sin[None, None])  # positions shared by the batch and the heads


@dataclass
class RemappedConfig(AttentionMethodConfig):
    """What dca and self_extend share as methods: one `RemappedAttention` computes attention for every
    remapped layer (the positions are the same in each), built once the model is checked.

    `layer_types`: on a model with one RoPE per attention type (Gemma 3: sliding-window layers and
    full-attention layers), the types whose attention is remapped; default the ones that attend over the
    whole context. The other layers keep their own attention and RoPE: a sliding window inside the original
    context never sees a distance the model was not trained on. Not given on a model with one RoPE."""

    mechanisms: ClassVar[tuple[str, ...]] = ("rope",)

    layer_types: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_types is not None:
            value = (self.layer_types,) if isinstance(self.layer_types, str) else self.layer_types
            if (not isinstance(value, (list, tuple)) or not value
                    or not all(isinstance(t, str) and t for t in value)):
                raise ParameterTypeError(f"layer_types must be a non-empty list of str, got {self.layer_types!r}")
            if len(set(value)) != len(value):
                raise InvalidParameterError(f"layer_types lists a type twice: {list(value)}")
            self.layer_types = tuple(value)

    def to_dict(self) -> dict:
        out = super().to_dict()
        if out["layer_types"] is None:  # one RoPE for all layers: the record reads as before layer_types existed
            del out["layer_types"]
        else:
            out["layer_types"] = list(out["layer_types"])
        return out

    def for_model(self, config, layer_types: list[str | None]) -> RemappedConfig:
        """The method with `layer_types` resolved against the text config `config`: None on a model with one
        RoPE for all layers, else the RoPE layer types it remaps (checked: known, not windowed)."""
        available = layer_types
        if available == [None]:
            if self.layer_types is not None:
                raise InvalidParameterError(
                    f"layer_types={list(self.layer_types)} given, but this {config.model_type} model has one RoPE for "
                    f"all layers; leave layer_types unset")
            return self
        chosen = list(self.layer_types) if self.layer_types is not None else [
            t for t in _compat.global_layer_types(config) if not _compat.is_local_layer_type(t)]
        unknown = [t for t in chosen if t not in available]
        if unknown:
            raise InvalidParameterError(
                f"layer_types {unknown} not in this {config.model_type} model's RoPE layer types {available}")
        local = [t for t in chosen if _compat.is_local_layer_type(t)]
        if local:
            raise InvalidParameterError(
                f"layer_types {local}: those layers attend within a sliding window (sliding_window="
                f"{getattr(config, 'sliding_window', None)}), which method {self.name!r} would drop; they stay as "
                f"they are. Choose among the full-attention types "
                f"{[t for t in available if not _compat.is_local_layer_type(t)]}")
        if not chosen:
            raise MethodNotApplicableError(
                f"method {self.name!r} remaps full-attention layers; every layer type of this {config.model_type} "
                f"model ({available}) attends within a window")
        return dataclasses.replace(self, layer_types=tuple(chosen))

    def rotated_layer_types(self) -> list[str | None]:
        return list(self.layer_types or [None])

    def computation(self, rotary: nn.Module, original: int) -> RemappedAttention:
        """The attention computation of the resolved method, with the model's rotary module."""
        raise NotImplementedError

    def attention_child(self, site: AttentionSite, module: nn.Module) -> nn.Module:
        """The remapped computation on the layers of `layer_types` (every layer on a model with one RoPE),
        one per layer type shared by its layers; the other layers' own attention on the others."""
        if self.layer_types is not None:
            layer_type = module_layer_type(site.config, module)
            if layer_type not in self.layer_types:
                return PositionalAttention(causal=module.is_causal, layout=site.layout)  # the layer as it was
        else:
            layer_type = None
        key = ("compute", layer_type)
        if key not in site.shared:
            check_model(self.name, site.config, site.inner, site.causal, self.layer_types)
            rotary = site.rotary if layer_type is None else LayerTypeRotary(site.rotary, layer_type)
            site.shared[key] = self.computation(rotary, site.config.max_position_embeddings)
        return PositionalAttention(causal=module.is_causal, layout=site.layout, compute=site.shared[key])


def module_layer_type(config, module: nn.Module) -> str:
    """The attention type of one attention module of a model with per-layer-type RoPE."""
    layer_type = getattr(module, "layer_type", None)
    if layer_type is None and isinstance(getattr(module, "layer_idx", None), int):
        layer_type = (getattr(config, "layer_types", None) or [None] * (module.layer_idx + 1))[module.layer_idx]
    if layer_type is None:
        raise MethodNotApplicableError(
            f"this {config.model_type} model has one RoPE per layer type, but its attention module "
            f"{type(module).__name__} names no layer type (layer_type / layer_idx)")
    return layer_type


class LayerTypeRotary(nn.Module):
    """The rotary module of a model with one RoPE per layer type, for one of them: (x, position_ids) ->
    (cos, sin), as a remapped computation calls it."""

    def __init__(self, rotary: nn.Module, layer_type: str):
        super().__init__()
        self.rotary, self.layer_type = rotary, layer_type

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        return self.rotary(x, position_ids, self.layer_type)

    def extra_repr(self) -> str:
        return f"layer_type={self.layer_type!r}"


def check_model(name: str, config, inner: str, causal: bool, layer_types: tuple[str, ...] | None = None) -> None:
    """What a remapped-attention method needs of the model, checked before the patch. `layer_types`: the RoPE
    layer types it remaps on a model with one RoPE per layer type (None: one RoPE, every layer)."""
    if not causal:
        raise MethodNotApplicableError(
            f"method {name!r} is built for decoder-only (causal) models; this {config.model_type} model attends "
            f"bidirectionally")
    if inner not in ("sdpa", "eager"):
        raise MethodNotApplicableError(
            f"method {name!r} runs its own SDPA kernel calls and reads the model's padding from its sdpa or eager "
            f"mask; this model runs attn_implementation={inner!r}. Load it with attn_implementation='sdpa'")
    if config.model_type in _compat.INTERLEAVED_ROTARY_MODEL_TYPES:
        raise MethodNotApplicableError(
            f"method {name!r} rotates q and k in the rotate-half layout; {config.model_type} rotates interleaved pairs")
    window = getattr(config, "sliding_window", None)
    if layer_types is None:
        local = [t for t in getattr(config, "layer_types", None) or [] if t != "full_attention"]
        if window is not None or local:
            raise MethodNotApplicableError(
                f"method {name!r} replaces full causal attention; this {config.model_type} model attends within a "
                f"sliding window (sliding_window={window}, layer types {sorted(set(local)) or 'all'}), which it would "
                f"drop")
    else:
        kept = sorted({t for t in getattr(config, "layer_types", None) or [] if t not in layer_types})
        original = config.max_position_embeddings
        if any(_compat.is_local_layer_type(t) for t in kept) and window is not None and window > original:
            raise MethodNotApplicableError(
                f"method {name!r} remaps the {list(layer_types)} layers and keeps the sliding layers {kept} as they "
                f"are; but their window (sliding_window={window}) is longer than the model's original context "
                f"{original}, so past it they would see distances the model was not trained on")
    for layer_type in layer_types or [None]:
        rope_type = _compat.get_rope_parameters(config, layer_type).get("rope_type", "default")
        if rope_type in ("dynamic", "longrope"):
            raise MethodNotApplicableError(
                f"method {name!r} reads cos / sin from the model's rotary module at fixed positions; this "
                f"checkpoint's rope_type={rope_type!r}{'' if layer_type is None else f' ({layer_type})'} changes "
                f"them with the input length")
