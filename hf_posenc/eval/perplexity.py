"""Perplexity of a causal LM three ways: per document, with a sliding window over a long text, and
as a curve over positions (how well the model predicts token p, for p up to and past its context).

All work from `token_nll`, the loss of every token from one forward pass. For a long input the
output layer runs in chunks, so 16k tokens x a 49k vocabulary never sit in memory as float logits."""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import _compat
from ..config import check_bool, check_number
from ..errors import InvalidInputError, ParameterTypeError, UnsupportedModelError
from ..causal_lm import check_causal_lm, check_token_ids, decoder, output_logits, vocabulary_size
from ..record_reader import method_class, read_record
from ..registry import find_family

LENGTH_DEPENDENT_ROPE_TYPES = ("dynamic", "longrope")  # transformers' own, chosen from the input length


def is_length_dependent(model: torch.nn.Module) -> bool:
    """True when the positions of a token depend on the length of the whole input (dynamic scaling,
    LongRoPE's short/long switch): then one pass over L tokens is not what a prompt of p < L tokens sees."""
    if not hasattr(getattr(model, "config", None), "get_text_config"):
        raise InvalidInputError(f"model must be a transformers model, got {model!r:.60} ({type(model).__name__})")
    record = read_record(model.config)
    if record is not None:
        return method_class(record).length_dependent
    config = model.config.get_text_config()
    if not _compat.has_rope(config):
        return False
    return any(_compat.get_rope_parameters(config, t).get("rope_type") in LENGTH_DEPENDENT_ROPE_TYPES
               for t in _compat.rope_layer_types(config))


def check_length(model: torch.nn.Module, length: int) -> None:
    """Refuse, before any forward, an input of `length` tokens the model cannot take (past a learned position
    table, the model's own or a patch's): hp.check_length's SequenceTooLongError, naming the length, the limit
    and the methods that lift it, instead of the embedding's IndexError. A model no family knows passes."""
    try:
        family = find_family(model)
    except UnsupportedModelError:
        return
    if hasattr(family, "check_length"):
        family.check_length(model, int(length))


def _chunked_head(model: torch.nn.Module):
    """(body, head) when logits are exactly head(body(ids)), checked on a few tokens: the head is the output
    layer with the families' scalings (soft-capping, logit_scale: `causal_lm.output_logits`), so those models' long
    passes never hold [1, n, vocab] logits either; else None (the caller then uses the full forward)."""
    body = decoder(model)
    if model.get_output_embeddings() is None or body is model:
        return None

    def head(hidden: torch.Tensor) -> torch.Tensor:
        return output_logits(model, hidden)

    probe = torch.arange(8, device=model.device)[None] % model.config.get_text_config().vocab_size
    full = model(probe, use_cache=False).logits
    return (body, head) if torch.equal(head(body(probe, use_cache=False)[0]), full) else None


@torch.inference_mode()
def token_nll(model: torch.nn.Module, input_ids: torch.Tensor, *, chunk_size: int = 1024) -> torch.Tensor:
    """Negative log-likelihood (nats, float32) of each token given the ones before it, from one forward
    pass: [batch, length - 1] for input_ids [batch, length] (entry t scores token t + 1)."""
    check_number("chunk_size", chunk_size, minimum=1, integer=True, optional=False)
    check_causal_lm(model, "token_nll")
    ids = _token_ids(model, input_ids)
    check_length(model, ids.shape[1])
    targets = ids[:, 1:]
    split = _chunked_head(model) if ids.shape[1] > chunk_size else None
    if split is None:
        return _cross_entropy(model(ids, use_cache=False).logits[:, :-1], targets)
    body, head = split
    hidden = body(ids, use_cache=False)[0][:, :-1]
    return torch.cat([_cross_entropy(head(hidden[:, s:s + chunk_size]), targets[:, s:s + chunk_size])
                      for s in range(0, hidden.shape[1], chunk_size)], dim=1)


def _token_ids(model: torch.nn.Module, input_ids) -> torch.Tensor:
    """input_ids as a [batch, length] tensor of the model's token ids, on its device; refused with what is
    wrong when it is not one (a float, an empty or a 3-d tensor, ids outside the vocabulary)."""
    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InvalidInputError(f"input_ids must be token ids (a tensor or a list of ints), got {input_ids!r:.80}: "
                                f"{err}") from None
    if ids.dim() not in (1, 2) or ids.shape[-1] == 0 or ids.is_floating_point() or ids.is_complex() \
            or ids.dtype == torch.bool:
        raise InvalidInputError(f"input_ids must be a non-empty [length] or [batch, length] tensor of int token ids, "
                                f"got shape {tuple(ids.shape)} of {ids.dtype}")
    check_token_ids(model, ids)
    return (ids[None] if ids.dim() == 1 else ids).to(model.device)


def token_list(value, name: str) -> list[int]:
    """`value` (a list, tuple or 1-d tensor of ints) as a list of token ids; refused naming `name` and what it
    got when it is not one (a str, None, a float, a nested list)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise InvalidInputError(f"{name} must be token ids (a list of ints), got a tensor of shape "
                                    f"{tuple(value.shape)} of {value.dtype}")
        return value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidInputError(f"{name} must be token ids (a list of ints), got {value!r:.60} ({type(value).__name__})")
    bad = next((t for t in value if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
    if bad is not None:
        raise InvalidInputError(f"{name} must be token ids (a list of ints), but it holds {bad!r:.40} "
                                f"({type(bad).__name__})")
    return [int(t) for t in value]


def as_token_ids(doc, name: str) -> torch.Tensor:
    """One document (a list or 1-d tensor of token ids) as a tensor; refused naming it when it is not one."""
    if isinstance(doc, (str, bytes)) or doc is None:
        raise InvalidInputError(f"{name} must be token ids (a list of ints, corpora.tokenize's input_ids), got "
                                f"{doc!r:.60}")
    try:
        ids = torch.as_tensor(doc)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidInputError(f"{name} must be token ids (a list of ints), got {doc!r:.60}") from None
    if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise InvalidInputError(f"{name} must be a list of int token ids, got shape {tuple(ids.shape)} of {ids.dtype}")
    return ids


def _documents(documents, what: str) -> list[torch.Tensor]:
    """`documents` (a list of token id lists, or a [n_docs, n] tensor) as 1-d tensors, each checked before
    any pass."""
    if documents is None or isinstance(documents, (str, bytes)) or not hasattr(documents, "__len__") \
            or not hasattr(documents, "__getitem__"):
        raise InvalidInputError(f"{what} takes documents as a list of token id lists (corpora.tokenize's input_ids), "
                                f"got {documents!r:.60}")
    return [as_token_ids(doc, f"documents[{i}]") for i, doc in enumerate(documents)]


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token loss (float32) of logits [batch, n, vocab] against targets [batch, n]. Flattened to rows
    rather than transposed to [batch, vocab, n]: a log-softmax over a strided vocabulary dimension is
    ~4x slower on CPU (benchmarks/bench_eval_onepass.py)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view(targets.shape)


def _summary(nll_sum: float, tokens: int) -> dict:
    return {"nll": nll_sum / tokens, "perplexity": math.exp(nll_sum / tokens), "tokens": tokens}


def document_perplexity(model: torch.nn.Module, documents: Sequence[Sequence[int]], *, max_length: int,
                        progress: bool = True) -> dict:
    """Each document (token ids) truncated to `max_length` tokens and scored in one pass. Returns the
    token-weighted perplexity over all documents and each document's own ("per_document")."""
    check_number("max_length", max_length, minimum=2, integer=True, optional=False)
    documents = _documents(documents, "document_perplexity")
    if not len(documents):
        raise InvalidInputError("document_perplexity needs at least one document, got none")
    check_length(model, max(min(len(doc), max_length) for doc in documents))  # every document, before any runs
    per_doc, total, count = [], 0.0, 0
    for doc in tqdm(documents, desc="perplexity", unit="doc", disable=not progress):
        ids = torch.as_tensor(doc[:max_length])
        if len(ids) < 2:
            raise InvalidInputError(f"a document needs at least 2 tokens to be scored, got {len(ids)}")
        nll = token_nll(model, ids)[0]
        per_doc.append(math.exp(nll.mean().item()))
        total, count = total + nll.sum().item(), count + nll.numel()
    return {**_summary(total, count), "per_document": per_doc}


def perplexity_by_length(model: torch.nn.Module, documents: Sequence[Sequence[int]], lengths: Sequence[int], *,
                         one_pass: bool | None = None, progress: bool = True) -> dict:
    """Per-document perplexity against context length, the measure of the long-context papers (Position
    Interpolation, YaRN): each document truncated to n tokens and scored in one pass, for each n in
    `lengths`. (Their sliding window of n tokens with stride S over a document truncated to n tokens is
    that one window: the stride plays no part.) Every document needs max(lengths) tokens.

    A model whose positions do not depend on the input length gives every n from one pass over
    max(lengths) tokens (the loss of token t depends only on the tokens before it); a length-dependent
    one (`is_length_dependent`: dynamic scaling) gets a pass per length, as a prompt of n tokens would.
    Returns "perplexity" (token-weighted over the documents) and "per_document" ([document][length])."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise ParameterTypeError(f"lengths must be a list of ints (token counts), got {lengths!r:.60} "
                                 f"({type(lengths).__name__})")
    if one_pass is not None:
        check_bool("one_pass", one_pass)
    documents = _documents(documents, "perplexity_by_length")
    lengths = list(lengths)
    for i, n in enumerate(lengths):
        check_number(f"lengths[{i}]", n, minimum=2, integer=True, optional=False)
    lengths = sorted(set(int(n) for n in lengths))
    if not lengths or lengths[0] < 2:
        raise InvalidInputError(f"lengths must be a non-empty list of token counts >= 2, got {list(lengths)}")
    short = [(i, len(d)) for i, d in enumerate(documents) if len(d) < lengths[-1]]
    if not documents or short:
        listed = ", ".join(f"#{i}: {n}" for i, n in short[:8]) + (" ..." if len(short) > 8 else "")
        raise InvalidInputError(f"perplexity at {lengths[-1]} tokens needs documents of at least {lengths[-1]} tokens; "
                         + (f"too short (document: tokens): {listed}" if short else "no documents were given"))
    check_length(model, lengths[-1])
    if one_pass is None:
        one_pass = not is_length_dependent(model)
    nll_sums = torch.zeros(len(documents), len(lengths), dtype=torch.float64)
    bar = tqdm(total=len(documents) * (1 if one_pass else len(lengths)), desc=f"perplexity at {lengths}",
               disable=not progress)
    for i, doc in enumerate(documents):
        ids = torch.as_tensor(doc[:lengths[-1]])
        if one_pass:
            cumulative = token_nll(model, ids)[0].double().cpu().cumsum(0)
            nll_sums[i] = cumulative[[n - 2 for n in lengths]]  # tokens 1 .. n - 1 of the first n
            bar.update()
        else:
            for j, n in enumerate(lengths):
                nll_sums[i, j] = token_nll(model, ids[:n])[0].double().sum().cpu()
                bar.update()
    bar.close()
    scored = torch.tensor([n - 1 for n in lengths], dtype=torch.float64)
    return {"lengths": lengths, "documents": len(documents), "one_pass": one_pass,
            "perplexity": (nll_sums.sum(0) / (scored * len(documents))).exp().tolist(),
            "per_document": (nll_sums / scored).exp().tolist()}


def strided_perplexity(model: torch.nn.Module, input_ids: Sequence[int], *, window: int, stride: int,
                       bos: int | None = None, progress: bool = True) -> dict:
    """Perplexity of one long text with a sliding window (transformers' "perplexity of fixed-length
    models" recipe): windows of `window` tokens start every `stride` tokens, and each scores only the
    tokens no earlier window scored, so every token is scored once with at least `window - stride`
    tokens of context (all of them in the first window). The first token has no context and is not
    scored; nor is the first token of each window when stride == window (plain chunks).

    With `bos` (the model's BOS token id, for models that always see it first), every window is that
    token then `window - 1` tokens of the text: the BOS is context, never scored, and the text's first
    token is scored after it."""
    has_bos = bos is not None
    span = window - has_bos  # tokens of the text per window
    check_number("window", window, minimum=2, integer=True, optional=False)
    check_number("bos", bos, minimum=0, integer=True)
    if has_bos and bos >= vocabulary_size(model):
        raise InvalidInputError(f"bos={bos} is not a token id of this model (0..{vocabulary_size(model) - 1})")
    check_number("stride", stride, minimum=1, integer=True, optional=False)
    if not 0 < stride <= span:
        allowed = f"1..window - 1 ({span}: the BOS takes a position)" if has_bos else f"1..window ({window})"
        raise InvalidInputError(f"stride must be in {allowed}, got {stride}")
    ids = as_token_ids(input_ids, "input_ids")
    if len(ids) < 2:
        raise InvalidInputError(f"the text needs at least 2 tokens to be scored, got {len(ids)}")
    check_length(model, min(window, len(ids) + has_bos))
    prefix = ids.new_tensor([bos] if has_bos else [])
    total, count, scored_to = 0.0, 0, 0 if has_bos else 1  # without a BOS, token 0 has no context: never scored
    starts = range(0, max(len(ids) - span, 0) + stride, stride)
    for begin in tqdm(starts, desc=f"strided perplexity ({window})", unit="window", disable=not progress):
        end = min(begin + span, len(ids))
        nll = token_nll(model, torch.cat([prefix, ids[begin:end]]))[0]  # entry j: token begin + j + 1 - has_bos
        new = nll[max(scored_to - begin - 1 + has_bos, 0):]
        total, count, scored_to = total + new.sum().item(), count + new.numel(), end
        if end == len(ids):
            break
    return {**_summary(total, count), "window": window, "stride": stride}


def perplexity_curve(model: torch.nn.Module, documents: Sequence[Sequence[int]], *, length: int,
                     bucket: int = 256, prefix: bool | None = None, progress: bool = True) -> dict:
    """Perplexity by position: documents of at least `length` tokens, cut to `length`, averaged per
    bucket of `bucket` positions ("positions" holds each bucket's last position, "perplexity" its value).

    One forward pass of `length` tokens per document scores every position at once. That equals
    scoring each position from its own prefix (causal attention) unless the model is length dependent
    (`is_length_dependent`): then `prefix=True` (the default for such models) scores each bucket from a
    separate pass over the tokens up to its end, as a prompt of that length would be run."""
    check_number("length", length, minimum=2, integer=True, optional=False)
    check_number("bucket", bucket, minimum=1, integer=True, optional=False)
    if prefix is not None:
        check_bool("prefix", prefix)
    documents = _documents(documents, "perplexity_curve")
    docs = [torch.as_tensor(d[:length]) for d in documents if len(d) >= length]
    if not docs:
        longest = max((len(d) for d in documents), default=0)
        raise InvalidInputError(f"no document has {length} tokens (the longest has {longest}); use a shorter length "
                         f"or a corpus with longer documents")
    check_length(model, length)
    if prefix is None:
        prefix = is_length_dependent(model)
    ends = list(range(bucket, length, bucket)) + [length]  # bucket i scores tokens ends[i-1] .. ends[i] - 1
    nll = torch.zeros(length - 1)
    bar = tqdm(total=len(docs) * (len(ends) if prefix else 1), desc=f"perplexity curve ({length})",
               disable=not progress)
    for doc in docs:
        if prefix:
            for start, end in zip([1] + ends[:-1], ends):
                nll[start - 1:end - 1] += token_nll(model, doc[:end])[0, start - 1:].cpu()
                bar.update()
        else:
            nll += token_nll(model, doc)[0].cpu()
            bar.update()
    bar.close()
    nll /= len(docs)
    starts = [1] + ends[:-1]
    means = [nll[start - 1:end - 1].mean().item() for start, end in zip(starts, ends)]
    return {"length": length, "bucket": bucket, "documents": len(docs), "prefix": prefix,
            "positions": [e - 1 for e in ends], "tokens": [e - s for s, e in zip(starts, ends)],
            "nll": means, "perplexity": [math.exp(m) for m in means]}


def curve_perplexity(curve: dict, start: int, end: int | None = None) -> float:
    """Perplexity over the curve's buckets whose positions fall in [start, end), weighted by their tokens
    (the first bucket has one fewer: token 0 is not scored). From a one-pass curve (`prefix=False`),
    `curve_perplexity(curve, 0, n)` at a bucket boundary n is the perplexity of the first n tokens scored
    in one pass, as `document_perplexity(..., max_length=n)` gives it, for every n from one forward."""
    if not isinstance(curve, dict) or not {"positions", "nll"} <= set(curve):
        raise InvalidInputError(f"curve must be what perplexity_curve returns (with 'positions' and 'nll'), got "
                                f"{str(curve)[:80]!r}")
    check_number("start", start, minimum=0, optional=False)
    check_number("end", end, above=start)
    rows = [(n, w) for p, n, w in zip(curve["positions"], curve["nll"], curve.get("tokens") or [1] * len(curve["nll"]))
            if p >= start and (end is None or p < end)]
    return math.exp(sum(n * w for n, w in rows) / sum(w for _, w in rows)) if rows else float("nan")


@contextlib.contextmanager
def pass_progress(model: torch.nn.Module, desc: str, min_tokens: int):
    """Inside the block, each forward of at least `min_tokens` tokens shows a progress bar over the model's
    attention layers: a long pass takes minutes on a CPU, and the bar's rate says how long is left in it.
    The layers are watched, not the model's own call: evaluation runs the decoder without its output layer."""
    layers = [module for _, module in _compat.attention_modules(model)]
    bar = None

    def step(module, args, kwargs, output):
        nonlocal bar
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if hidden is None or hidden.shape[-2] < min_tokens:
            return
        if bar is None:
            bar = tqdm(total=len(layers), desc=f"{desc}, {hidden.shape[-2]}-token pass", unit="layer", leave=False)
        bar.update()
        if bar.n >= bar.total:
            bar.close()
            bar = None

    handles = [layer.register_forward_hook(step, with_kwargs=True) for layer in layers]
    try:
        yield
    finally:
        if bar is not None:
            bar.close()
        for handle in handles:
            handle.remove()
