"""A Hugging Face tokenizer written as a GGUF file's tokenizer, in the keys llama.cpp reads (`tokenizer.ggml.*`).

Written: byte-level BPE tokenizers (GPT-2's kind: SmolLM2, StarCoder, GPT-2 itself), whose tokens, merges and
special ids carry over one to one, as llama.cpp's `gpt2` tokenizer model. What llama.cpp cannot be told is refused,
never approximated: llama.cpp splits text before BPE with a regex it picks by the name in `tokenizer.ggml.pre`, so
a pre-tokenizer is written only where one of those names splits text exactly as the tokenizer does (llama.cpp,
src/llama-vocab.cpp: "gpt-2" is GPT-2's regex alone; "smollm" and "starcoder" split every digit first, then apply
GPT-2's regex, and differ in whether decoded text has its spaces cleaned up). Anything else (a normalizer, a
SentencePiece model, another split) names `vocab_from`: a GGUF file llama.cpp's converter wrote for the vocabulary.
A BPE without merges has no GGUF form at all (llama.cpp needs them, GGUF holds no empty array). A `vocab_from` file's
keys are copied only where they tell llama.cpp to split text as the model's tokenizer does (`check_copied`).
"""

from __future__ import annotations

import json

from .serving import ExportError

# llama.cpp's token types (gguf.TokenType): what each id is
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# the tokenizer's special ids -> their GGUF keys (gguf.Keys.Tokenizer; "seperator" is llama.cpp's spelling)
SPECIAL_IDS = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
               "unk_token_id": "tokenizer.ggml.unknown_token_id", "pad_token_id": "tokenizer.ggml.padding_token_id",
               "sep_token_id": "tokenizer.ggml.seperator_token_id", "mask_token_id": "tokenizer.ggml.mask_token_id"}

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
_DIGITS = {"type": "Digits", "individual_digits": True}


def _pre_tokenizer_name(spec: dict | None, clean_up_spaces: bool) -> str | None:
    """llama.cpp's name for a pre-tokenizer (tokenizer.json's `pre_tokenizer`), or None where it has none."""
    def byte_level(p):
        return isinstance(p, dict) and all(p.get(k) == v for k, v in _BYTE_LEVEL.items())

    if byte_level(spec):
        return "gpt-2"
    if isinstance(spec, dict) and spec.get("type") == "Sequence":
        parts = spec.get("pretokenizers") or []
        if len(parts) == 2 and parts[0] == _DIGITS and byte_level(parts[1]):
            return "starcoder" if clean_up_spaces else "smollm"
    return None


def _describe(spec) -> str:
    if not isinstance(spec, dict):
        return repr(spec)
    if spec.get("type") == "Sequence":
        return "Sequence(" + ", ".join(_describe(p) for p in spec.get("pretokenizers") or []) + ")"
    return str(spec.get("type"))


def _spec(tokenizer) -> dict | None:
    """The tokenizer's tokenizer.json as a dict (None: a tokenizer without a `tokenizers` backend)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return None if backend is None else json.loads(backend.to_str())


def _kind(spec: dict) -> str | None:
    """None for a byte-level BPE (llama.cpp's `gpt2` tokenizer model), else what the tokenizer is instead."""
    model, decoder = (spec.get("model") or {}).get("type"), (spec.get("decoder") or {}).get("type")
    return None if model == "BPE" and decoder == "ByteLevel" else f"{model} with a {decoder} decoder"


# llama.cpp's tokenizer models (tokenizer.ggml.model), in words
GGML_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece", "bert": "WordPiece", "t5": "SentencePiece Unigram"}


def check_copied(values: dict, vocab_from, tokenizer) -> None:
    """The tokenizer keys of a GGUF file copied for the model (`values`: its header's) tell llama.cpp how to split
    text as the model's `tokenizer` does (where given): the same kind of tokenizer and, for a byte-level BPE, its
    merges and the name of its pre-tokenizer (without one llama.cpp splits with its default regex, not GPT-2's)."""
    model = values.get("tokenizer.ggml.model")
    spec = _spec(tokenizer) if tokenizer is not None else None
    if spec is not None and (model == "gpt2") != (_kind(spec) is None):
        ours = "a byte-level BPE (llama.cpp's 'gpt2')" if _kind(spec) is None else \
            f"a {_kind(spec)}, not a byte-level BPE (llama.cpp's 'gpt2')"
        raise ExportError(f"vocab_from {vocab_from} has tokenizer.ggml.model {model!r} "
                          f"({GGML_MODELS.get(model, 'a tokenizer llama.cpp names so')}), but the model's tokenizer is "
                          f"{ours}: llama.cpp would split text into other tokens; give the GGUF file this model was "
                          f"converted from, or leave vocab_from (--vocab-from) out to write the model's own tokenizer")
    missing = [k for k in ("tokenizer.ggml.merges", "tokenizer.ggml.pre") if k not in values]
    if model == "gpt2" and missing:
        raise ExportError(f"vocab_from {vocab_from} has a gpt2 (byte-level BPE) tokenizer without "
                          f"{' and '.join(missing)}: llama.cpp would "
                          + ("refuse the file (it reads a BPE's merges from there)" if "tokenizer.ggml.merges" in missing
                             else "split text with its default regex, not the tokenizer's")
                          + "; give a GGUF file converted with its tokenizer (llama.cpp's convert_hf_to_gguf.py writes "
                            "both), or leave vocab_from (--vocab-from) out to write the model's own tokenizer")


def tokenizer_fields(tokenizer, vocab_size: int) -> dict[str, object]:
    """The `tokenizer.*` keys of a GGUF file for `tokenizer` (a transformers tokenizer with a `tokenizers` backend),
    `vocab_size` tokens long (ids the tokenizer lacks are written as unused `[PAD<id>]` tokens, as llama.cpp's
    converter does). Raises ExportError naming what cannot be written."""
    if not callable(getattr(tokenizer, "convert_ids_to_tokens", None)):
        raise ExportError(f"tokenizer must be the model's transformers tokenizer (hp.load_tokenizer(folder)), got "
                          f"{type(tokenizer).__name__} {tokenizer!r:.40}")
    spec = _spec(tokenizer)
    if spec is None:
        raise ExportError(f"the model's tokenizer ({type(tokenizer).__name__}) has no tokenizer.json form to write; "
                          f"give vocab_from (--vocab-from) a GGUF file of this vocabulary")
    model, kind = spec.get("model") or {}, _kind(spec)
    refuse = None
    if kind is not None:
        refuse = f"its model is {kind}, not byte-level BPE"
    elif not model.get("merges"):
        raise ExportError("the model's tokenizer cannot be written as a GGUF tokenizer: it is a BPE without merges, and "
                          "llama.cpp's gpt2 model reads a BPE's merges from tokenizer.ggml.merges, which GGUF cannot "
                          "hold empty (nor llama.cpp load without): no GGUF file carries this tokenizer")
    elif spec.get("normalizer") is not None:
        refuse = f"it normalizes text first ({_describe(spec['normalizer'])}), which llama.cpp's gpt2 model does not"
    clean_up = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    pre = _pre_tokenizer_name(spec.get("pre_tokenizer"), clean_up)
    if refuse is None and pre is None:
        refuse = (f"its pre-tokenizer {_describe(spec.get('pre_tokenizer'))} splits text as none of llama.cpp's "
                  f"named pre-tokenizers hf_posenc writes (gpt-2; smollm / starcoder: digits apart, then gpt-2)")
    if refuse:
        raise ExportError(f"the model's tokenizer cannot be written as a GGUF tokenizer: {refuse}; give vocab_from "
                          f"(--vocab-from) a GGUF file of this vocabulary (llama.cpp's convert_hf_to_gguf.py "
                          f"writes one)")

    ids = dict(model.get("vocab") or {})
    kinds = {}
    for added in spec.get("added_tokens") or []:
        ids[added["content"]] = added["id"]
        kinds[added["id"]] = CONTROL if added.get("special") else USER_DEFINED
    by_id = {i: token for token, i in ids.items()}
    if len(by_id) != len(ids):
        raise ExportError("the model's tokenizer gives one id to two tokens: its vocabulary has no GGUF form")
    if by_id and max(by_id) >= vocab_size:
        raise ExportError(f"the model's tokenizer has ids up to {max(by_id)}, past the model's vocab_size "
                          f"{vocab_size}: the tokenizer is not this model's")
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [kinds.get(i, NORMAL if i in by_id else UNUSED) for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]

    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    fields: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_space_prefix": False,
        # what the tokenizer adds around a text on its own, read off an encoding rather than flags it may not keep
        "tokenizer.ggml.add_bos_token": len(with_special) > len(plain) and with_special[0] == tokenizer.bos_token_id,
        "tokenizer.ggml.add_eos_token": len(with_special) > len(plain) and with_special[-1] == tokenizer.eos_token_id,
    }
    for attribute, key in SPECIAL_IDS.items():
        token_id = getattr(tokenizer, attribute, None)
        if isinstance(token_id, int) and 0 <= token_id < vocab_size:
            fields[key] = token_id
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        fields["tokenizer.chat_template"] = template
    return fields
