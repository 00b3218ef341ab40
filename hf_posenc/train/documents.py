"""Documents kept apart inside a packed training window (document masking: ProLong, Gao et al. 2024; Llama 3).

A window of packed documents (each one ended by EOS, `hf_posenc.corpora.pack_exact`) is trained as if each document
were its own sequence: the position ids restart at 0 where a document begins, and no token attends to a token of
another document. The mask is the one transformers builds itself from position ids that restart when the model
gets no 2D attention mask (`masking_utils.find_packed_sequence_indices`): a block-diagonal causal mask for SDPA
and eager attention, sliding windows kept, FlashAttention's variable-length kernel, a FlexAttention BlockMask.
`kept_apart(model)` drops the 2D mask on the way into the decoder; the loss still reads it: padding, and the first
token of each document (`unscored_starts`: the previous document's EOS cannot predict it), are not scored.

With SDPA that mask is n x n booleans (1 GiB at 32k): memory in the square of the window. `attend_per_document`
(attention implementation PER_DOCUMENT) needs none: each document's causal block is its own SDPA call (the kernels
that need no mask), its bounds read from the position ids every layer gets, so a recomputed layer (activation
checkpointing) finds them again. `use_per_document(model)` switches a plain-SDPA model without sliding windows to it.

    ids = document_position_ids(batch["input_ids"], batch["attention_mask"], eos_token_id=tokenizer.eos_token_id)
    with kept_apart(model):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=ids).logits
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from .. import causal_lm
from ..errors import InvalidInputError, UnsupportedModelError

# Attention implementations that mask packed documents from restarting position ids (transformers 5): the
# others (a kernel registered by a user, paged attention) get no mask at all and would read across documents.
MASKING_BACKENDS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


def document_position_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor, *, eos_token_id: int) -> torch.Tensor:
    """Position ids that restart at 0 at each document of each row: after every EOS, and where the padding
    after a row's last token begins (padding is its own sequence, which no real token sees: it comes last)."""
    if not isinstance(eos_token_id, int) or isinstance(eos_token_id, bool):   # None or "</s>": no document would end
        raise InvalidInputError(f"eos_token_id must be the token id (an int) that ends a document, got "
                                f"{eos_token_id!r}: documents are told apart by it")
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise InvalidInputError(f"input_ids and attention_mask must both be [batch, tokens], got "
                                f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    if input_ids.shape[1] == 0:
        return torch.zeros_like(input_ids)   # no token: no position
    real = attention_mask.bool()
    starts = torch.zeros_like(real)
    starts[:, 0] = True
    starts[:, 1:] = (input_ids[:, :-1] == eos_token_id) | (real[:, 1:] != real[:, :-1])
    index = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return index - _segment_starts(starts, index)


def _segment_starts(starts: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The column where each token's segment begins, from the [rows, tokens] flags of where segments start
    (column 0 always one) and each token's column."""
    return torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values


PER_DOCUMENT = "hf_posenc_documents"   # the attention implementation of `attend_per_document`


def _segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each document of one row: where the ids do not increase (they restart). Ids that jump up
    stay in their document: spread ids inside documents (`spread_in_documents`) keep their far pairs."""
    starts = (position_ids[1:] <= position_ids[:-1]).nonzero().flatten().add(1).tolist()
    bounds = [0, *starts, int(position_ids.shape[0])]
    return list(zip(bounds, bounds[1:]))


def attend_per_document(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' SDPA attention, one causal call per document: the documents are where the layer's position ids
    restart. Given a mask (padding), fewer queries than keys (a cache) or no ids: SDPA as transformers runs it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    ids = kwargs.get("position_ids")
    if attention_mask is not None or ids is None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kwargs.pop("is_causal", None)
    batch, tokens = query.shape[0], query.shape[2]
    ids = ids.expand(batch, -1)
    out = None
    for b in range(batch):
        for s, e in _segments(ids[b]):
            part = sdpa_attention_forward(module, query[b:b + 1, :, s:e], key[b:b + 1, :, s:e], value[b:b + 1, :, s:e],
                                          None, dropout=dropout, scaling=scaling, is_causal=True, **kwargs)[0]
            if batch == 1 and e - s == tokens:   # one document: the call's own output, no copy
                return part, None
            # written into one output part by part: no list of every part beside their concatenation
            if out is None:
                out = part.new_empty((batch, tokens, *part.shape[2:]))   # [batch, tokens, heads, head_dim]
            out[b:b + 1, s:e] = part
    return out, None


def _per_document_mask(*args, attention_mask=None, q_length=None, kv_length=None, kv_offset=0, **kwargs):
    """No mask where the attention cuts the documents itself (a forward without a 2D mask or a cache: the ids say
    where documents restart, or that there is one); SDPA's own mask elsewhere."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None and q_length == kv_length and not kv_offset:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, q_length=q_length, kv_length=kv_length,
                     kv_offset=kv_offset, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PER_DOCUMENT, attend_per_document)
    AttentionMaskInterface.register(PER_DOCUMENT, _per_document_mask)


def why_not_per_document(config, attn_implementation: str) -> str | None:
    """Why a model of `config` keeps SDPA's mask (None: it can attend per document): another implementation, or
    layers whose window or chunk a per-document causal call would not keep."""
    if attn_implementation not in ("sdpa", PER_DOCUMENT):
        return f"attention {attn_implementation!r}, not sdpa"
    text = config.get_text_config()
    local = {t for t in (getattr(text, "layer_types", None) or []) if t != "full_attention"}
    if getattr(text, "sliding_window", None) or getattr(text, "attention_chunk_size", None) or local:
        return "its layers attend in windows or chunks"
    return None


def use_per_document(model: nn.Module) -> bool:
    """Switch `model` to PER_DOCUMENT attention where it can take it (`why_not_per_document`); True when it did."""
    config = decoder_of(model).config
    if why_not_per_document(config, config._attn_implementation) is not None:
        return False
    _register()
    decoder_of(model).config._attn_implementation = PER_DOCUMENT   # the config every layer reads at each forward
    return True


def plain_sdpa(model: nn.Module) -> None:
    """Back to transformers' SDPA after `use_per_document` (what a saved or returned model runs)."""
    config = decoder_of(model).config
    if config._attn_implementation == PER_DOCUMENT:
        config._attn_implementation = "sdpa"


def unscored_starts(attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """The 2D mask of the tokens a loss scores: the first token of each document after a row's first is left out,
    as its own forward would leave it (nothing of its document precedes it; the token before it is the previous
    document's EOS). Under `kept_apart` the model's attention comes from the position ids, so this mask is the
    loss's only: the model never reads it."""
    scored = attention_mask.clone()
    scored[:, 1:] = scored[:, 1:] * (position_ids[:, 1:] != 0)
    return scored


def spread_in_documents(batch: dict, scheme, *, seed: int, first_index: int, window: int) -> dict:
    """A batch of documents kept apart (collated by `hf_posenc.train.data.collate(pad, eos, document_numbers=True)`:
    its `document` numbers, ids restarting at each document, a mask leaving their first tokens unscored) with
    the spread ids of `scheme` (a `hf_posenc.train.positions` scheme: PoSE, CREAM, ...) inside each document. The
    scheme draws the window's ids as it does for a joined window (text=span: the rows are target-long spans, cut
    to `window` tokens at those ids, so a document that ends between two chunks ends there too); then each
    document's ids are moved down to start at 0 where its first token in the window is, so its distances are the
    drawn ones and a new document restarts the ids. What the window leaves of a document before its first token
    here is not its context: that token is not scored (`unscored_starts`). Padding keeps 0, 1, ...: a segment of
    its own, after the documents."""
    if "document" not in batch:
        raise InvalidInputError("spread_in_documents takes a batch collated with documents kept apart and numbered "
                                "(collate(pad, eos, document_numbers=True)): it has no 'document' numbers to keep "
                                "the spread ids inside")
    real = batch["document"] >= 0
    drawn = scheme.add_position_ids({**batch, "attention_mask": real.long(), "scored": batch["attention_mask"]},
                                    seed=seed, first_index=first_index, window=window)
    document, scored, ids = drawn.pop("document"), drawn.pop("scored"), drawn["position_ids"]
    index = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    starts = torch.ones_like(document, dtype=torch.bool)
    starts[:, 1:] = document[:, 1:] != document[:, :-1]
    first = _segment_starts(starts, index)
    ids = torch.where(document >= 0, ids - ids.gather(1, first), index - first)
    return {**drawn, "position_ids": ids, "attention_mask": unscored_starts(scored, ids)}


def document_index(position_ids: torch.Tensor) -> torch.Tensor:
    """The document number of each token (0, 1, ... along each row), from ids that restart at each one."""
    restarts = torch.ones_like(position_ids, dtype=torch.bool)
    restarts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return restarts.cumsum(1) - 1


@contextlib.contextmanager
def kept_apart(model: nn.Module) -> Iterator[None]:
    """Inside the block, a forward of the model's decoder that is given position ids attends within each document
    only: its 2D attention mask and any cache are dropped, so transformers builds the packed-documents mask from
    the ids. For training forwards: generate outside the block. A forward without position ids is left as it is
    (its ids would be 0..n-1: one document)."""
    decoder = decoder_of(model)

    def drop_mask(module, args, kwargs):
        if kwargs.get("position_ids") is not None:
            # no cache either (`cache`, `past_key_values` before transformers 5.2x): transformers looks for packed
            # documents only in a forward without one
            kwargs.update(attention_mask=None, use_cache=False)
            for name in ("cache", "past_key_values"):
                if kwargs.get(name) is not None:
                    kwargs[name] = None
        return args, kwargs

    handle = decoder.register_forward_pre_hook(drop_mask, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def decoder_of(model: nn.Module) -> nn.Module:
    """The transformers decoder (LlamaModel, ...) inside a causal LM, a PEFT or DDP wrapper looked through."""
    inner = model
    for _ in range(4):
        inner = getattr(inner, "module", inner)   # DDP
        inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner   # PEFT
    body = causal_lm.decoder(inner)
    if body is inner:
        raise UnsupportedModelError(f"{type(model).__name__} has no decoder (base_model) to keep documents apart in")
    return body


def check_model(model_type: str, attn_implementation: str, batch_size: int) -> None:
    """Refuses what would read across documents: a family whose decoder is not known to build transformers'
    packed mask from restarting ids (OPT rebuilds its positions from the 2D mask; state-space layers carry their
    state over), an attention implementation it builds no mask for, and FlashAttention with more than one row
    (transformers takes a batch of several rows for unpacked and runs the plain causal kernel)."""
    from ..families.rope_models import TESTED_MODEL_TYPES

    if model_type not in TESTED_MODEL_TYPES:
        raise UnsupportedModelError(f"documents kept apart are verified on {', '.join(sorted(TESTED_MODEL_TYPES))} "
                                    f"(tests/test_documents.py), not on {model_type!r}, whose decoder may not mask "
                                    f"packed documents")
    if attn_implementation not in MASKING_BACKENDS:
        raise InvalidInputError(f"attention {attn_implementation!r} cannot keep documents apart (transformers builds "
                                f"no mask for it from restarting position ids); use one of "
                                f"{', '.join(MASKING_BACKENDS)}")
    if attn_implementation.startswith("flash_attention") and batch_size > 1:
        raise InvalidInputError(f"{attn_implementation} keeps packed documents apart in a batch of one row only "
                                f"(transformers' variable-length path), got {batch_size} rows: use batch_size 1 "
                                f"with grad_accum, or sdpa")


MASK_KINDS = {"flash_attention_2": "FlashAttention's variable-length kernel",
              "flash_attention_3": "FlashAttention's variable-length kernel",
              "flex_attention": "a FlexAttention block mask", "sdpa": "SDPA with a block-diagonal causal mask",
              "eager": "eager attention with a block-diagonal causal mask"}


def mask_kind(attn_implementation: str, config=None) -> str:
    """What keeps the documents apart, for the run's summary line (`config`: the model's, which says whether
    SDPA runs a call per document)."""
    if config is not None and why_not_per_document(config, attn_implementation) is None:
        return "SDPA, one causal call per document: no mask"
    return MASK_KINDS[attn_implementation]
