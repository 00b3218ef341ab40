"""A whole GGUF file written from a model in memory (a fine-tune's or a search's folder, safetensors): the weights in
F32 / F16 / BF16 / Q8_0 under llama.cpp's tensor names, the model's hyperparameters, its tokenizer (written from
the model's own, gguf_tokenizer.py, or copied from a GGUF file that holds the same vocabulary), and the patch's rope
metadata and factor tensors (`serving.gguf_rope_metadata` / `gguf_rope_tensors`: what llama.cpp reads).

    hp.write_gguf_model(model, "smollm2-32k-f16.gguf", tokenizer=tokenizer, dtype="f16")

Tensor names come from the `gguf` library's own map (`gguf.get_tensor_name_map`), so a name it does not know is
refused, never guessed. llama.cpp's `llama` graph rotates interleaved pairs (x0, x1), (x2, x3), ... where
transformers rotates the two halves of each head: the q and k projections' rows are reordered to match, as
llama.cpp's own converter does (`reorder_rows` below). Families: Llama-architecture checkpoints (`llama`, and the
models transformers stores the same way: SmolLM2, Mistral without sliding windows); others are refused naming them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from .. import _compat
from . import gguf_header, gguf_tokenizer
from ..config import check_bool
from ..errors import MethodNotApplicableError
from ..record_reader import read_record
from .serving import ExportError, add_gguf_fields, check_gguf_output, gguf_rope_metadata, gguf_rope_tensors, whole_file

# transformers model_type -> llama.cpp architecture, for the families whose weights map one to one
ARCHITECTURES = {"llama": "llama", "mistral": "llama"}
DTYPES = ("f32", "f16", "bf16", "q8_0")


def reorder_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """The rows of a q or k projection reordered from transformers' halves (x_i paired with x_{i + d/2}) to
    llama.cpp's interleaved pairs (x_{2i} with x_{2i+1}), head by head."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


Q8_0_BLOCK = 32   # values a q8_0 block holds: a row of another length cannot be written in it


def gguf_tokens(path: Path) -> list[str]:
    """The tokens of a GGUF file's tokenizer, in id order."""
    import gguf

    field = gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"]
    return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]


def check_vocabulary(vocab_from: Path, tokenizer, vocab_size: int) -> None:
    """vocab_from's tokens are the model's own tokenizer's, id by id (not only as many): another vocabulary of the
    same size would be written into the file without a word."""
    tokens = gguf_tokens(vocab_from)
    mine = tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(tokenizer)))))
    differ = [i for i, (a, b) in enumerate(zip(tokens, mine)) if a != b]
    if differ or len(mine) != len(tokens):
        first = differ[0] if differ else min(len(mine), len(tokens))
        theirs = tokens[first] if first < len(tokens) else None
        ours = mine[first] if first < len(mine) else None
        raise ExportError(f"vocab_from {vocab_from} is not this model's vocabulary: token {first} is {theirs!r} there, "
                          f"{ours!r} in the model's tokenizer ({len(differ)} of {len(tokens)} ids differ); give the GGUF "
                          f"file this model was converted from")


def model_name(config) -> str:
    """The name a GGUF file's general.name carries: the checkpoint's own (a hub id's last part, a folder's name),
    never a machine path, and never an architecture's name: transformers' GGUF reader takes a llama file named
    "mistral" for a Mistral one (and then reads none of it), so such a name is written "mistral (hf_posenc export)"."""
    import gguf
    from transformers import CONFIG_MAPPING

    ref = str(getattr(config, "_name_or_path", "") or "").strip().rstrip("/\\")
    name = re.split(r"[/\\]", ref)[-1]
    if name in ("", ".", "..", "~") or name.endswith(":"):   # a path with no name of its own ("C:", "..")
        return "hf_posenc export"
    architectures = {a.replace("-", "_") for a in [*CONFIG_MAPPING.keys(), *gguf.MODEL_ARCH_NAMES.values()]}
    return f"{name} (hf_posenc export)" if name.lower().replace("-", "_") in architectures else name


def check_model(model: torch.nn.Module, target: Path, vocab_from: Path | None, dtype: str, overwrite: bool,
                tokenizer=None) -> tuple[str, dict | None]:
    """Everything checked before a byte is written, on the model or its meta skeleton (the config is what is
    read; with `tokenizer`, vocab_from's tokens against it). Returns llama.cpp's architecture and, without
    vocab_from, the tokenizer's GGUF keys (gguf_tokenizer.tokenizer_fields)."""
    for name, value in (("target", target), ("vocab_from", vocab_from)):
        if value is None and name == "vocab_from":   # the tokenizer is written instead
            continue
        if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            raise ExportError(f"{name} must be a path (str or os.PathLike), got {value!r:.60}")
    check_bool("overwrite", overwrite)
    if vocab_from is None and tokenizer is None:
        raise ExportError("write_gguf_model needs the model's tokenizer (tokenizer=, written into the file) or a GGUF "
                          "file of its vocabulary (vocab_from=, whose tokenizer is copied)")
    target = Path(target)
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise ExportError(f"write_gguf_model needs a transformers model, got {type(model).__name__}")
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    text = model.config.get_text_config()
    arch = ARCHITECTURES.get(text.model_type)
    if arch is None or getattr(text, "sliding_window", None):
        raise MethodNotApplicableError(
            f"write_gguf_model writes the {', '.join(sorted(ARCHITECTURES))} families (llama.cpp's llama graph), not "
            f"a {text.model_type} model{' with sliding windows' if arch else ''}; convert it with llama.cpp's "
            f"convert_hf_to_gguf.py and add the patch with hp.write_gguf")
    rope_type = _compat.get_rope_parameters(text, None).get("rope_type", "default")
    if read_record(model.config) is None and rope_type != "default":
        raise MethodNotApplicableError(
            f"the model's rope_parameters have rope_type {rope_type!r} of its own (no hf_posenc patch made it): "
            f"llama.cpp's convert_hf_to_gguf.py writes a checkpoint's own scaling; write_gguf_model writes the "
            f"patches hf_posenc makes")
    if vocab_from is not None:
        vocab_from = Path(vocab_from)
        check_gguf_output(vocab_from, target, overwrite, "the vocab_from file")
        vocab_keys = _check_vocab_file(vocab_from, text.vocab_size)
    else:
        check_gguf_output(None, target, overwrite, "the output")
    if dtype == "q8_0":
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        rows = {"hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size,
                "num_attention_heads x head_dim": text.num_attention_heads * head_dim}
        odd = {k: v for k, v in rows.items() if v % Q8_0_BLOCK}
        if odd:
            raise ExportError(f"q8_0 stores rows in blocks of {Q8_0_BLOCK} values; this model's "
                              f"{', '.join(f'{k} {v}' for k, v in odd.items())} is not a multiple of {Q8_0_BLOCK}: "
                              f"use f16, bf16 or f32")
    if getattr(text, "partial_rotary_factor", 1.0) != 1.0:
        raise MethodNotApplicableError("partial rotary dims are not written: llama.cpp's llama graph rotates the "
                                       "whole head")
    if vocab_from is None:
        return arch, gguf_tokenizer.tokenizer_fields(tokenizer, text.vocab_size)
    if tokenizer is not None:
        check_vocabulary(vocab_from, tokenizer, text.vocab_size)
    gguf_tokenizer.check_copied(vocab_keys, vocab_from, tokenizer)   # and how llama.cpp is told to split text
    return arch, None


def _check_vocab_file(vocab_from: Path, vocab_size: int) -> dict[str, object]:
    """vocab_from is a GGUF file with a tokenizer of the model's size that llama.cpp can split text with. Returns
    its header's keys."""
    try:
        header = gguf_header.read(vocab_from)
    except (ValueError, OSError) as err:
        raise ExportError(f"vocab_from {vocab_from} is not a readable GGUF file: {err}") from None
    count = getattr(header.values.get("tokenizer.ggml.tokens"), "count", None)
    if count != vocab_size:
        raise ExportError(f"vocab_from {vocab_from} holds {count} tokens, the model {vocab_size}: it is not "
                          f"this model's vocabulary")
    if not header.values.get("tokenizer.ggml.model"):
        raise ExportError(f"vocab_from {vocab_from} has tokens but no tokenizer.ggml.model (how llama.cpp splits "
                          f"text into them): give a GGUF file converted with its tokenizer")
    return header.values


def _tensors(model: torch.nn.Module, arch: str) -> list[tuple[str, np.ndarray]]:
    """(llama.cpp name, float32 array) of every weight, q and k reordered; an unknown name refused."""
    import gguf

    text = model.config.get_text_config()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, text.num_hidden_layers)
    state = model.state_dict()
    out = []
    for name, value in state.items():
        if "rotary_emb" in name:   # buffers: the rope is in the metadata
            continue
        if name == "lm_head.weight" and getattr(text, "tie_word_embeddings", False):
            continue   # llama.cpp reads the tied head from token_embd
        stem, _, suffix = name.rpartition(".")
        mapped = names.get_name(stem)
        if mapped is None:
            raise MethodNotApplicableError(f"the tensor {name} has no llama.cpp name in the gguf library's {arch} "
                                           f"map: this checkpoint's layout is not llama's")
        array = value.detach().to(torch.float32).cpu().numpy()
        if stem.endswith("q_proj"):
            array = reorder_rows(array, text.num_attention_heads)
        elif stem.endswith("k_proj"):
            array = reorder_rows(array, text.num_key_value_heads)
        out.append((f"{mapped}.{suffix}", array))
    return out


def write_gguf_model(model: torch.nn.Module, target: str | os.PathLike, *, tokenizer=None,
                     vocab_from: str | os.PathLike | None = None, dtype: str = "f32",
                     overwrite: bool = False) -> dict[str, object]:
    """Write `model` (patched or not) as a whole GGUF file at `target`: the weights in `dtype` (f32, f16, bf16 or
    q8_0; vectors and norms stay F32, as llama.cpp's converter keeps them), a tokenizer, the rope metadata and
    factor tensors of the patch. The tokenizer: `tokenizer` (the model's own, a byte-level BPE:
    gguf_tokenizer.tokenizer_fields) written into the file, or, with `vocab_from` (a GGUF file with the same
    vocabulary: for SmolLM2, the embedded one), that file's tokenizer copied, checked id by id against `tokenizer`
    where both are given. Everything is checked first; the file appears whole or not at all. Returns the rope keys
    written."""
    import gguf

    arch, tokenizer_keys = check_model(model, target, vocab_from, dtype, overwrite, tokenizer)
    target = Path(target)
    rope = gguf_rope_metadata(model, arch)
    factors = gguf_rope_tensors(model, arch)
    tensors = _tensors(model, arch)
    text = model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[dtype]
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype]
    with whole_file(target) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=arch)
        writer.add_name(model_name(model.config))
        writer.add_context_length(int(text.max_position_embeddings))
        writer.add_embedding_length(text.hidden_size)
        writer.add_block_count(text.num_hidden_layers)
        writer.add_feed_forward_length(text.intermediate_size)
        writer.add_head_count(text.num_attention_heads)
        writer.add_head_count_kv(text.num_key_value_heads)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
        writer.add_layer_norm_rms_eps(float(text.rms_norm_eps))
        writer.add_rope_freq_base(float(_compat.get_rope_parameters(text, None)["rope_theta"]))
        writer.add_vocab_size(text.vocab_size)
        writer.add_file_type(file_type)
        # the tokenizer: the model's own, written, or the vocab file's, copied
        copied = [] if tokenizer_keys is not None else [
            (k, f) for k, f in gguf.GGUFReader(vocab_from).fields.items() if k.startswith("tokenizer.")]
        # then the patch's keys but the two written above from the same config
        add_gguf_fields(writer, copied, {**(tokenizer_keys or {}), **{
            k: v for k, v in rope.items() if not k.endswith((".context_length", ".rope.freq_base"))}})
        for name, array in tensors:
            if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
                writer.add_tensor(name, array)
            elif qtype == gguf.GGMLQuantizationType.F16:
                writer.add_tensor(name, array.astype(np.float16))
            else:
                writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        for name, values in factors.items():
            writer.add_tensor(name, values)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return {**rope, **{name: values.tolist() for name, values in factors.items()}}
