"""Training data for the fine-tune recipe: documents loaded (the first ones of a stream), tokenized and
packed exactly (`hf_posenc.corpora.pack_exact`), framed as the tokenizer frames an input, cached on disk; and
the collate that pads a batch of blocks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Optional

import torch

from .. import corpora
from .. import loading
from ..errors import ConfigError


def _fingerprint(tokenizer) -> str:
    from datasets.fingerprint import Hasher

    return Hasher.hash(tokenizer)


def frame_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one input (BERT: [CLS], [SEP])."""
    plain, full = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    start = next(i for i in range(len(full)) if full[i:i + len(plain)] == plain)
    return full[:start], full[start + len(plain):]


def boundary_ids(tokenizer, bos: bool) -> tuple[int, Optional[int]]:
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos is None:
        raise ConfigError("the tokenizer has no EOS (nor SEP) token to mark document boundaries")
    bos_id = (tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id) if bos else None
    return eos, bos_id


def load_documents(args, corpus: Optional[str] = None):
    """The corpus as a datasets.Dataset with a "text" column (the first max_documents of a stream); `args`: a
    fine-tune config's data section (corpus, split, text_column, streaming, max_documents, cache_dir)."""
    import datasets

    spec = corpus or args.corpus
    if args.streaming and spec.partition(":")[0] not in corpora.BUILTIN and not corpora._local_files(spec):
        name, _, subset = spec.partition(":")
        stream = datasets.load_dataset(name, subset or None, split=args.split, streaming=True)
        rows = [{"text": r[args.text_column]} for r, _ in zip(stream, range(args.max_documents))]
        return datasets.Dataset.from_list(rows)
    docs = corpora.load_corpus(spec, split=args.split, text_column=args.text_column)
    if args.max_documents:
        docs = docs.select(range(min(args.max_documents, len(docs))))
    return docs


def prepare_data(args, tokenizer, preflight, cache_root: Optional[str] = None):
    """Tokenized, exactly packed sequences (`hf_posenc.corpora.pack_exact`), cached on disk by what
    determines them (corpus, tokenizer, lengths, boundaries): a second run loads them in a second.
    For encoders, each block is framed as the tokenizer frames one input ([CLS] ... [SEP]), as the
    model always sees it (position 0 is [CLS]), within seq_len.
    Call under `accelerator.main_process_first()`: the main process builds, the others load. `args`: a
    fine-tune config's data section; `preflight`: the recipe's checks' result (its lengths, its position scheme)."""
    import datasets

    eos, bos = boundary_ids(tokenizer, args.framing == "bos")
    if args.framing == "bos" and bos is None:
        raise ConfigError("data.framing is bos, but the tokenizer has no BOS (nor CLS) token; use auto or none")
    if args.framing == "auto":  # a causal LM's documents start as its tokenizer starts an input (Llama, Gemma: BOS)
        bos = next(iter(corpora.bos_prefix(tokenizer)), None) if preflight.causal else None
    head, tail = ([], []) if preflight.causal else frame_ids(tokenizer)
    key = json.dumps({"corpus": args.corpus, "split": args.split, "column": args.text_column,
                      "max_documents": args.max_documents, "tokenizer": _fingerprint(tokenizer),
                      "seq_len": preflight.block_len, "short_share": args.short_share, "short_len": preflight.short_len,
                      "eos": eos, "bos": bos, "frame": [head, tail], "whole_spans": preflight.positions.span,
                      "v": 3}, sort_keys=True)
    root = Path(cache_root or args.cache_dir or loading.CACHE_DIR / "data")
    folder = root / hashlib.sha1(key.encode()).hexdigest()[:16]
    if (folder / "dataset_info.json").exists():
        return datasets.load_from_disk(str(folder))
    docs = load_documents(args)
    tokenized = corpora.tokenize(docs, tokenizer, bos=False)  # pack_exact puts the BOS
    extra = len(head) + len(tail)
    packed = corpora.pack_exact(tokenized, preflight.block_len - extra, eos_token_id=eos, bos_token_id=bos,
                              short_share=args.short_share, short_length=preflight.short_len and preflight.short_len - extra)
    if extra:
        blocks = [head + b + tail for b in packed["input_ids"]]
        packed = datasets.Dataset.from_dict({"input_ids": blocks, "length": [len(b) for b in blocks]})
    packed = trainable_blocks(packed, args.corpus, sum(tokenized["num_tokens"]))
    if preflight.positions.span:
        packed = whole_spans(packed, args.corpus, preflight.block_len)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    try:
        packed.save_to_disk(str(tmp))
        (tmp / "key.json").write_text(key)
        loading.publish(tmp, folder, "dataset_info.json")   # two runs side by side: the first one's is kept
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return datasets.load_from_disk(str(folder))


def trainable_blocks(packed, corpus: str, document_tokens: int):
    """The blocks that teach something: a block of one token predicts nothing, and a batch of such blocks
    has a loss of 0/0 = NaN (the corpus' last block can be one EOS). No document token at all: refused."""
    if document_tokens == 0:
        raise ConfigError(f"data.corpus={corpus!r} gives zero training tokens (its documents are empty once "
                          f"tokenized); nothing to train on")
    keep = [i for i, n in enumerate(packed["length"]) if n >= 2]
    return packed if len(keep) == len(packed) else packed.select(keep)


def whole_spans(packed, corpus: str, span: int):
    """text=span takes each window's tokens at ids anywhere in [0, span): only whole spans hold them all (the
    corpus' last, shorter block is left out). A corpus shorter than one span is refused."""
    keep = [i for i, n in enumerate(packed["length"]) if n == span]
    if not keep:
        raise ConfigError(f"data.corpus={corpus!r} has {max(packed['length'], default=0)} tokens, fewer than one "
                          f"span of {span} (train.positions text=span takes each window from a span of the target "
                          f"context): use more text, a lower target, or text=window")
    return packed if len(keep) == len(packed) else packed.select(keep)


def collate(pad_id: int, documents_eos: Optional[int] = None, document_numbers: bool = False):
    """Pads a batch of blocks (only the corpus' last block, or short ones, are shorter): padding gets
    attention 0 and label -100. With `documents_eos` (data.packing=documents), each block's position ids
    restart after every EOS and a document's first token is not scored (`hf_posenc.train.documents`); with
    `document_numbers` too, `document` numbers the documents of each row (-1: padding), for
    `documents.spread_in_documents` to keep spread ids inside them (a key no model takes: pop it first)."""
    def fn(rows):
        n = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, :len(r["input_ids"])] = 1
        batch = {"input_ids": ids, "attention_mask": mask}
        if documents_eos is not None:
            from .documents import document_index, document_position_ids, unscored_starts

            batch["position_ids"] = document_position_ids(ids, mask, eos_token_id=documents_eos)
            batch["attention_mask"] = unscored_starts(mask, batch["position_ids"])
            if document_numbers:
                batch["document"] = document_index(batch["position_ids"]).masked_fill(mask == 0, -1)
        return batch
    return fn
