"""hf_posenc/loading.py: a tokenizer folder transformers cannot read is refused naming the file and what is wrong
with it, from the library (hp.load_tokenizer) and from the command line (one `error:` line)."""

from __future__ import annotations

import pytest
from refusals import one_line_refusal
from tiny import TINY_TEXT_VOCAB, save_text_models, tiny_model

import hf_posenc as hp


@pytest.fixture
def saved(tmp_path):
    """A saved tiny Llama (yarn x4) with its byte-level tokenizer (tokenizer.json, tokenizer_config.json)."""
    save_text_models(tmp_path, saved=hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB), "yarn", factor=4))
    return tmp_path / "saved"


def cut_tokenizer_json(folder):
    text = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(text[:len(text) // 2])


@pytest.mark.parametrize("damage, says", [
    (cut_tokenizer_json, "{folder}/tokenizer.json is not valid JSON (Expecting "),
    (lambda folder: (folder / "tokenizer.json").unlink(), "{folder} has no tokenizer.json, and transformers builds no "
                                                           "tokenizer from the other files it holds"),
], ids=["cut", "missing"])
def test_a_tokenizer_folder_transformers_cannot_read_is_refused_naming_the_file(saved, tmp_path, capsys, damage, says):
    """A tokenizer.json cut in half gave json's position without the file's name; tokenizer_config.json without
    tokenizer.json gave transformers' advice to install sentencepiece."""
    from hf_posenc.cli import main

    damage(saved)
    says = says.format(folder=saved)
    with pytest.raises(hp.InvalidInputError) as refusal:
        hp.load_tokenizer(saved)
    assert str(refusal.value).startswith(says) and "sentencepiece" not in str(refusal.value), str(refusal.value)
    line = one_line_refusal(capsys, main, ["export", str(saved), "--out", str(tmp_path / "m.gguf")])
    assert says in line, line
    assert not (tmp_path / "m.gguf").exists()
