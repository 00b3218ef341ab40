"""A model's own tokenizer written as a GGUF tokenizer (hf_posenc.export.gguf_tokenizer): SmolLM2's, written from
the transformers tokenizer, carries the tokens, types, merges, special ids, flags and chat template llama.cpp's own
converter wrote into the embedded GGUF file; the pre-tokenizer is named only where llama.cpp splits text the same
way, and anything else is refused before the export writes a byte. llama.cpp itself tokenizing with the written
file is in tests/test_llama_cpp.py (the engine tier)."""

from __future__ import annotations

import json
import re

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import hf_posenc as hp
from hf_posenc.export.gguf_tokenizer import tokenizer_fields

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def smollm2():
    """(the transformers tokenizer of the embedded SmolLM2, the tokenizer keys of its GGUF file)."""
    from hf_posenc import assets

    try:
        path = assets.smollm2_gguf()
    except Exception as err:   # the asset is a separate install
        pytest.skip(f"the embedded SmolLM2 GGUF is not installed: {err}")
    reader = gguf.GGUFReader(path)
    keys = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    return hp.load_tokenizer("smollm2"), keys


def test_smollm2s_tokenizer_is_written_as_llama_cpps_converter_wrote_it(smollm2):
    tokenizer, theirs = smollm2
    ours = tokenizer_fields(tokenizer, 49152)
    differ = {k for k in theirs if ours.get(k) != theirs[k]}
    # transformers' GGUF loader rebuilds SmolLM2's tokenizer with GPT-2's split alone (no digits apart), so the
    # tokenizer hf_posenc measured with is llama.cpp's "gpt-2", where the original file says "smollm"
    assert differ == {"tokenizer.ggml.pre"}, differ
    assert ours["tokenizer.ggml.pre"] == "gpt-2" and theirs["tokenizer.ggml.pre"] == "smollm"
    assert json.loads(tokenizer.backend_tokenizer.to_str())["pre_tokenizer"]["type"] == "ByteLevel"
    assert set(ours) - set(theirs) == {"tokenizer.ggml.add_eos_token"} and not ours["tokenizer.ggml.add_eos_token"]


def byte_bpe(pre_tokenizer=None, normalizer=None, clean_up: bool = False, special: bool = True):
    """A byte-level BPE with four merges, an <eos> (special or not) and the given pre-tokenizer."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("a", "b"), ("ab", "c"), ("Ġ", "1"), ("1", "2")]   # "Ġ1": a space and a digit, which "smollm" splits
    for a, b in merges:
        vocab[a + b] = len(vocab)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    raw.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    if normalizer is not None:
        raw.normalizer = normalizer
    out = PreTrainedTokenizerFast(tokenizer_object=raw, clean_up_tokenization_spaces=clean_up)
    out.add_tokens([AddedToken("<eos>", special=special)], special_tokens=special)
    if special:
        out.eos_token = "<eos>"
    return out


DIGITS_THEN_GPT2 = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False)])


@pytest.mark.parametrize("pre, clean_up, name", [
    (None, False, "gpt-2"),
    (DIGITS_THEN_GPT2, False, "smollm"),      # SmolLM2's own tokenizer.json; llama.cpp keeps its spaces
    (DIGITS_THEN_GPT2, True, "starcoder"),    # the same split, spaces cleaned up when decoding
])
def test_a_byte_level_bpe_is_written_under_the_pre_tokenizer_llama_cpp_splits_the_same_way(pre, clean_up, name):
    tokenizer = byte_bpe(pre, clean_up=clean_up)
    size = len(tokenizer) + 3   # a model's embedding rounded up past its tokenizer
    keys = tokenizer_fields(tokenizer, size)
    assert keys["tokenizer.ggml.pre"] == name and keys["tokenizer.ggml.model"] == "gpt2"
    tokens = keys["tokenizer.ggml.tokens"]
    assert len(tokens) == size and tokens[-3:] == [f"[PAD{i}]" for i in range(size - 3, size)]
    assert tokens[tokenizer.convert_tokens_to_ids("abc")] == "abc"
    assert keys["tokenizer.ggml.merges"] == ["a b", "ab c", "Ġ 1", "1 2"]
    types = keys["tokenizer.ggml.token_type"]
    eos = tokenizer.convert_tokens_to_ids("<eos>")
    assert types[eos] == 3 and types[0] == 1 and types[-1] == 5   # control, normal, unused
    assert keys["tokenizer.ggml.eos_token_id"] == eos and "tokenizer.ggml.bos_token_id" not in keys


def test_an_added_token_that_is_not_special_is_user_defined():
    tokenizer = byte_bpe(special=False)
    keys = tokenizer_fields(tokenizer, len(tokenizer))
    assert keys["tokenizer.ggml.token_type"][tokenizer.convert_tokens_to_ids("<eos>")] == 4


@pytest.mark.parametrize("make, said", [
    (lambda: byte_bpe(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)])),
     "pre-tokenizer Sequence(Digits, ByteLevel) splits text as none of llama.cpp's"),
    (lambda: byte_bpe(pre_tokenizers.ByteLevel(add_prefix_space=True)), "pre-tokenizer ByteLevel splits"),
    (lambda: byte_bpe(pre_tokenizers.Whitespace()), "pre-tokenizer Whitespace splits"),
    (lambda: byte_bpe(normalizer=normalizers.NFKC()), "it normalizes text first (NFKC)"),
])
def test_a_tokenizer_llama_cpp_would_split_otherwise_is_refused_naming_what_it_is(make, said):
    with pytest.raises(hp.PosEncError, match="cannot be written as a GGUF tokenizer") as refusal:
        tokenizer_fields(make(), 300)
    assert said in str(refusal.value) and "--vocab-from" in str(refusal.value)


def test_a_tokenizer_that_is_not_a_byte_level_bpe_or_not_the_models_is_refused():
    with pytest.raises(hp.PosEncError, match="tokenizer must be the model's transformers tokenizer .*got str"):
        tokenizer_fields("gpt2", 2)
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0))
    with pytest.raises(hp.PosEncError, match="its model is Unigram"):
        tokenizer_fields(PreTrainedTokenizerFast(tokenizer_object=unigram), 2)
    with pytest.raises(hp.PosEncError, match="ids up to 260, past the model's vocab_size 128"):
        tokenizer_fields(byte_bpe(), 128)


def test_a_bpe_without_merges_is_refused_before_anything_is_written(tmp_path):
    """A byte-level BPE with no merges (tests/tiny.py's) ended in the gguf library's "Invalid GGUF metadata array.
    Empty array" (a ValueError), half-way through writing."""
    from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer

    with pytest.raises(hp.PosEncError, match="cannot be written as a GGUF tokenizer: it is a BPE without merges, and "
                                             "llama.cpp's gpt2 model reads a BPE's merges from tokenizer.ggml.merges"):
        hp.write_gguf_model(tiny_model(vocab_size=TINY_TEXT_VOCAB), tmp_path / "m.gguf", tokenizer=tiny_tokenizer())
    assert not list(tmp_path.iterdir())


def vocab_file(path, tokenizer, **changed):
    """A small GGUF file with `tokenizer`'s keys as tokenizer_fields writes them, `changed` (None: left out)."""
    from test_serving import write_tiny_gguf

    from hf_posenc.export.serving import add_gguf_fields

    keys = {k: v for k, v in {**tokenizer_fields(tokenizer, len(tokenizer)), **changed}.items() if v is not None}
    return write_tiny_gguf(path, keys=lambda writer: add_gguf_fields(writer, [], keys))


@pytest.mark.parametrize("changed, says", [
    ({"tokenizer.ggml.model": "llama"}, "has tokenizer.ggml.model 'llama' (SentencePiece), but the model's tokenizer "
                                        "is a byte-level BPE (llama.cpp's 'gpt2')"),
    ({"tokenizer.ggml.pre": None}, "has a gpt2 (byte-level BPE) tokenizer without tokenizer.ggml.pre: llama.cpp "
                                   "would split text with its default regex"),
    ({"tokenizer.ggml.merges": None}, "has a gpt2 (byte-level BPE) tokenizer without tokenizer.ggml.merges: llama.cpp "
                                      "would refuse the file"),
], ids=["sentencepiece", "no-pre", "no-merges"])
def test_a_vocab_file_that_would_make_llama_cpp_split_text_otherwise_is_refused(tmp_path, capsys, changed, says):
    """`export --vocab-from V.gguf`, V's tokens the model's own: V saying SentencePiece for byte-level BPE tokens,
    or leaving out the pre-tokenizer, was copied as it was (exit 0), and llama.cpp split text otherwise."""
    from hf_posenc.cli import main
    from refusals import one_line_refusal
    from tiny import tiny_model

    tokenizer = byte_bpe()
    hp.patch(tiny_model(vocab_size=len(tokenizer)), "yarn", factor=4).save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    vocab = vocab_file(tmp_path / "v.gguf", tokenizer, **changed)
    line = one_line_refusal(capsys, main, ["export", str(tmp_path / "saved"), "--out", str(tmp_path / "m.gguf"),
                                           "--vocab-from", str(vocab)], alone=True)
    assert line.startswith(f"error: vocab_from {vocab} {says}"), line
    assert not (tmp_path / "m.gguf").exists()
    if "tokenizer.ggml.model" not in changed:   # a property of the file alone: refused without the tokenizer too
        with pytest.raises(hp.PosEncError, match=re.escape(says)):
            hp.write_gguf_model(tiny_model(vocab_size=len(tokenizer)), tmp_path / "m.gguf", vocab_from=vocab)
    main(["export", str(tmp_path / "saved"), "--out", str(tmp_path / "m.gguf"), "--vocab-from",
          str(vocab_file(tmp_path / "whole.gguf", tokenizer))])   # the whole file is copied
    assert gguf.GGUFReader(tmp_path / "m.gguf").fields["tokenizer.ggml.pre"].contents() == "gpt-2"


@pytest.mark.parametrize("pre", [None, DIGITS_THEN_GPT2], ids=["gpt-2", "smollm"])
def test_llama_cpp_splits_text_with_the_written_tokenizer_as_the_tokenizer_does(pre, tmp_path):
    """The engine tier: the whole file written with the tokenizer, its vocabulary read by llama.cpp, a text whose
    ids differ between the two splits (" 12": "Ġ1" "2" under GPT-2's, "Ġ" "1" "2" with digits apart) tokenized
    the same by both."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: scripts/build_engines.sh")
    from tiny import tiny_model

    tokenizer = byte_bpe(pre)
    hp.write_gguf_model(tiny_model(vocab_size=len(tokenizer)), tmp_path / "m.gguf", tokenizer=tokenizer)
    engine = llama_cpp.Llama(str(tmp_path / "m.gguf"), vocab_only=True, verbose=False)
    text = "ab 12 abc 112, 3x 1212<eos> ab"
    want = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert engine.tokenize(text.encode(), add_bos=False, special=True) == want
    other = byte_bpe(DIGITS_THEN_GPT2 if pre is None else None)(text, add_special_tokens=False)["input_ids"]
    assert other != want   # the text tells the two splits apart
