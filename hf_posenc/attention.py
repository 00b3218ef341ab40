"""Positions inside attention (ALiBi, relative bias, XPos, learned -> rotary), per model instance.

transformers' attention modules call `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`. A patch
gives each self-attention module a `PositionalAttention` child (its bias table, its q/k transform)
and sets the implementation of the model's own config copy to "hf_posenc_<inner>" (inner: the one
the model ran, "sdpa" or "eager"; q/k-only methods also take flash kernels). That function, registered
once, applies the module's child, then calls the inner function: the SDPA kernel stays, with the bias
given as a float attention mask (causal and padding masks folded in). Other models, patched or not,
are untouched: the registered function only acts on modules that carry a child.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch
from torch import nn

from . import _compat
from .config import MethodConfig
from .errors import CheckpointMismatchError, MethodNotApplicableError, UnsupportedModelError

if TYPE_CHECKING:
    from .plan import PatchPlan

CHILD = "hf_posenc_attention"  # the child each patched attention module carries
PREFIX = "hf_posenc_"  # attention implementations registered here: PREFIX + the inner one
QUERY_BLOCK = 512  # queries per kernel call when a bias runs in a causal model (see BlockLayout)


def distances(first_query: int, queries: int, keys: int, device=None) -> torch.Tensor:
    """i - j for the queries at positions first_query .. first_query + queries - 1 and the keys at
    positions 0 .. keys - 1, [queries, keys]. (A KV cache holds the keys before the first query; a
    block of queries sees the keys up to its last query.)"""
    query_positions = torch.arange(first_query, first_query + queries, device=device)
    return query_positions[:, None] - torch.arange(keys, device=device)[None, :]


class Block(NamedTuple):
    start: int  # the block's queries: start .. end - 1 of this call's queries
    end: int
    first: int  # the position of its first query (keys before it may sit in a KV cache)
    keys: int  # the keys it sees: positions 0 .. keys - 1
    allowed: torch.Tensor | None  # the model's mask for it: bool (True: attend) or float (added); None: all
    memo: dict  # what every layer's bias computes alike for this block in one forward (a relative table's rows)


class ScoreBias(nn.Module):
    """What a bias method's module gives: the additive bias of one block of queries on the attention scores.
    Subclasses implement `forward(first_query, queries, keys, dtype)` -> [heads, queries, keys] (the bias of
    queries at positions first_query .. + queries - 1 and keys 0 .. keys - 1), or `block_bias` itself."""

    # True when the bias is the same in every layer (fixed, or one module shared by all layers): the masks are
    # then built once a forward, not once a layer
    same_in_every_layer: ClassVar[bool] = False

    def block_bias(self, block: Block, dtype: torch.dtype) -> torch.Tensor:
        """The block's bias [batch | 1, heads, queries, keys], with the places a bool mask forbids set to the
        dtype's minimum (a float mask is added afterwards)."""
        bias = self(block.first, block.end - block.start, block.keys, dtype)[None]
        if block.allowed is not None and block.allowed.dtype == torch.bool:
            bias = bias.masked_fill(~block.allowed, torch.finfo(dtype).min)
        return bias


class BlockLayout:
    """The query blocks of one attention call, shared by every layer of a model (they see the same mask
    and lengths, so it is built once a forward).

    A float bias costs SDPA its causal shortcut: with `is_causal` it skips the keys after each query,
    with a mask it computes them all, then masks them. So a causal model's queries go in blocks of
    QUERY_BLOCK, each against the keys up to its last query only, which gets most of the shortcut back
    (4 blocks: 62.5 % of the score matrix computed, against 50 % for causal and 100 % in one call)."""

    def __init__(self):
        self._memo: tuple | None = None
        self.shared_masks: dict = {}  # type of a bias the same in every layer -> (blocks, dtype, its masks)

    def blocks(self, mask: torch.Tensor | None, q_len: int, k_len: int, causal: bool, split: bool,
               device: torch.device) -> list[Block]:
        shape = (q_len, k_len, causal, split, device)
        if self._memo is not None and self._memo[0] is mask and self._memo[1] == shape:
            return self._memo[2]
        size = QUERY_BLOCK if split and causal else q_len
        out = []
        for start in range(0, q_len, size):
            end = min(start + size, q_len)
            first, keys = k_len - q_len + start, k_len - q_len + end if causal else k_len
            allowed = None if mask is None else mask[..., start:end, :keys]
            if allowed is None and causal and end - start > 1:
                allowed = distances(first, end - start, keys, device)[None, None] >= 0
            out.append(Block(start, end, first, keys, allowed, {}))
        self._memo = (mask, shape, out)
        return out


class PositionalAttention(nn.Module):
    """What one attention layer does with positions: transform q and k (`qk`), add `bias` to the scores."""

    def __init__(self, *, causal: bool, bias: ScoreBias | None = None, qk: nn.Module | None = None,
                 layout: BlockLayout | None = None, compute: nn.Module | None = None):
        super().__init__()
        if bias is not None and not isinstance(bias, ScoreBias):
            raise TypeError(f"bias must be a hf_posenc.attention.ScoreBias, got {type(bias).__name__}")
        self.causal, self.bias, self.qk = causal, bias, qk
        self.compute = compute  # a method that computes attention itself (dca, self_extend)
        self.layout = layout or BlockLayout()

    def masks(self, mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor,
              split: bool) -> list[tuple[Block, torch.Tensor]]:
        """Each block with its float mask: the bias with the model's mask folded in, which SDPA and eager
        both add to the scores (masked places get the dtype's minimum, not -inf: a row of padding stays
        finite)."""
        dtype = query.dtype
        blocks = self.layout.blocks(mask, query.shape[-2], key.shape[-2], self.causal, split, query.device)
        shared = self.layout.shared_masks.get(type(self.bias)) if self.bias.same_in_every_layer else None
        if shared is not None and shared[0] is blocks and shared[1] == dtype:
            return shared[2]
        out = []
        for block in blocks:
            bias = self.bias.block_bias(block, dtype)
            if block.allowed is not None and block.allowed.dtype != torch.bool:
                bias = bias + block.allowed
            out.append((block, bias))
        if self.bias.same_in_every_layer:  # every layer of the forward gets the same masks
            self.layout.shared_masks[type(self.bias)] = (blocks, dtype, out)
        return out

    def extra_repr(self) -> str:
        return f"causal={self.causal}"


@dataclass
class AttentionSite:
    """What the self-attention layers of one model share, for a method building each layer's child
    (`AttentionMethodConfig.attention_child`)."""

    config: Any  # the model's text config
    inner: str  # the attention implementation the model ran ("sdpa", "eager", ...)
    causal: bool
    heads: int
    reference: torch.Tensor  # a parameter of the model: the device and dtype new tables take
    layout: BlockLayout  # the query blocks, built once a forward for every layer
    rotary: nn.Module | None  # the rotary module q and k are rotated with (RoPE models, learned -> rope)
    shared: dict = field(default_factory=dict)  # what a method builds once for every layer


# -- the interface of attention methods (its kin for RoPE and learned tables: hf_posenc/config.py) ----------
@dataclass
class AttentionMethodConfig(MethodConfig):
    """A method that acts inside attention: a bias added to the scores, or a transform of q and k.
    None of them bounds the input length: `max_position_embeddings` (default: the original context)
    only sets the advertised context."""

    adds_bias: ClassVar[bool] = False  # needs an attention kernel that takes an additive float mask
    removes_positions: ClassVar[bool] = True  # drops the model's own table / rotation
    needs_target: ClassVar[bool] = False  # the advertised context stays the original one unless given
    export_refusal: ClassVar[str | None] = (
        "it changes the attention computation itself, which engines do not load from a config")
    skipped_positions: ClassVar[str | None] = (
        "it computes the distances inside attention from the order of the tokens, not from position ids, so "
        "skipped ids would change nothing it learns")

    def for_model(self, config, layer_types: list[str | None]) -> AttentionMethodConfig:
        """The method (resolved) for the RoPE model whose text config is `config`, with the RoPE `layer_types`
        ([None]: one RoPE for all layers), checked against it: by default a model with one RoPE per layer type is
        refused; a method that acts on some layer types only says which (`rotated_layer_types`)."""
        if layer_types != [None]:
            raise UnsupportedModelError(
                f"method {self.name!r} is built for one RoPE shared by all layers; this {config.model_type} model "
                f"has one per layer type ({layer_types})")
        return self

    def rotated_layer_types(self) -> list[str | None]:
        """The RoPE layer types whose rotation the method (after `for_model`) takes over: [None] for all layers."""
        return [None]

    def attention_child(self, site: AttentionSite, module: nn.Module) -> nn.Module:
        """The `PositionalAttention` child of one self-attention `module` (resolved method; `site`: what every
        layer shares)."""
        raise NotImplementedError

    def check_rope_model(self, config) -> None:
        """Refuse a RoPE model (text config `config`) the method cannot act on; before anything changes."""

    def learned_rotary(self, new_config, device) -> nn.Module | None:
        """On a learned-table model: the rotary module the method rotates q and k with, after writing its
        rope_parameters into `new_config` (the patched config copy); None for methods that do not rotate."""
        return None


def positional_attention(inner: str):
    """The attention function registered as PREFIX + inner: the module's q/k transform, then the inner
    function, once per block of queries when there is a bias (`BlockLayout`)."""
    def attention(module, query, key, value, attention_mask, **kwargs):
        position = getattr(module, CHILD, None)
        if position is None:
            raise RuntimeError(
                f"attn_implementation {PREFIX + inner!r} is hf_posenc's, for attention modules patched by "
                f"hp.patch; {type(module).__name__} carries no patch. Set the model's attn_implementation back to "
                f"{inner!r}"
            )
        if position.compute is not None:
            return position.compute(module, query, key, value, attention_mask, **kwargs)
        function = _compat.attention_function(inner, module)
        if position.qk is not None:
            query, key = position.qk(query, key)
        if position.bias is None:
            return function(module, query, key, value, attention_mask, **kwargs)
        # eager returns the attention weights (tools read them): one block, as they expect
        masks = position.masks(attention_mask, query, key, split=inner != "eager")
        if len(masks) == 1:
            (block, mask), = masks
            return function(module, query, key[..., :block.keys, :], value[..., :block.keys, :], mask, **kwargs)
        outputs = [function(module, query[..., b.start:b.end, :], key[..., :b.keys, :], value[..., :b.keys, :], mask,
                            **kwargs)[0] for b, mask in masks]
        return torch.cat(outputs, dim=1), None  # [batch, queries, heads, head_dim]

    attention.__name__ = f"hf_posenc_{inner}_attention"
    return attention


def plan_attention(plan: PatchPlan, model: nn.Module, method: AttentionMethodConfig, new_config,
                   rotary: nn.Module | None = None) -> None:
    """Add to `plan` a PositionalAttention child on each self-attention module of `model`, and point the
    implementation of `new_config` (the model's text config copy) at the registered function.
    `rotary`: the rotary module of the model (or the one a learned -> rope swap builds), for methods that
    rotate q and k themselves."""
    config = model.config.get_text_config()
    if model.config.is_encoder_decoder:
        raise MethodNotApplicableError(
            f"method {method.name!r} is built for decoder-only and encoder-only models; this {config.model_type} "
            f"model is an encoder-decoder (its cross-attention has no relative positions)"
        )
    inner = _compat.attention_implementation(config)
    if inner.startswith(PREFIX) or not _compat.known_attention(inner):
        raise MethodNotApplicableError(
            f"method {method.name!r} works through transformers' attention interface; this model runs "
            f"attn_implementation={inner!r}, which hf_posenc cannot wrap. Load it with attn_implementation='sdpa'"
        )
    if method.adds_bias and inner not in ("sdpa", "eager"):
        raise MethodNotApplicableError(
            f"method {method.name!r} adds a bias to the attention scores; this model runs attn_implementation="
            f"{inner!r}, whose kernels take no additive bias. Load it with attn_implementation='sdpa' (or 'eager')"
        )
    modules = _compat.attention_modules(model)
    if not modules:
        raise MethodNotApplicableError(
            f"method {method.name!r} needs attention modules that call transformers' attention interface; this "
            f"{config.model_type} model has none"
        )
    causal = modules[0][1].is_causal
    site = AttentionSite(config=config, inner=inner, causal=causal, heads=config.num_attention_heads,
                         reference=next(model.parameters()), layout=BlockLayout(), rotary=rotary)
    for _, module in modules:
        plan.swaps.append((module, CHILD, method.attention_child(site, module).to(site.reference.device)))
    for kind in {inner, "eager"}:  # eager too: what tools that need attention weights switch to
        _compat.register_attention(PREFIX + kind, positional_attention(kind), like=kind)
    _compat.set_attention_implementation(new_config, PREFIX + inner)


def describe(model: nn.Module, method: AttentionMethodConfig, original_context: int) -> dict:
    """What `hp.describe` says of a model patched with the attention `method` (as its record holds it)."""
    config = model.config.get_text_config()
    mechanism = "bias" if method.adds_bias else "rope"
    limit = method.length_limit(original_context)
    return {"mechanism": mechanism, "attn_implementation": _compat.attention_implementation(config),
            "length_limit": limit}


def trained_tensors(model: nn.Module) -> list[str]:
    """State-dict names of what an attention patch adds that a checkpoint must hold (relative tables)."""
    return [name for name in model.state_dict() if f".{CHILD}." in name]


def restore_tensors(model: nn.Module, path) -> None:
    """Read into a freshly patched `model` the tensors its patch trained (relative bias tables) from the
    checkpoint at `path`."""
    wanted = trained_tensors(model)
    if not wanted:
        return
    saved = _compat.read_checkpoint_tensors(path, wanted)
    missing = sorted(set(wanted) - set(saved))
    if missing:
        raise CheckpointMismatchError(
            f"{path}: the config records an hf_posenc attention patch, but the checkpoint lacks "
            f"{missing[:3]}{' ...' if len(missing) > 3 else ''}"
        )
    model.load_state_dict(saved, strict=False)


# what a checkpoint holds of an attention patch, which stock loading reports as unexpected
SAVED_SUFFIXES = (f".{CHILD}.bias.table",)
