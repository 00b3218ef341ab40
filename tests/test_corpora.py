"""hf_posenc.corpora given bad input, as a hostile new user would give it: what is not a corpus, and corpus files
that cannot be read (malformed JSON lines or Parquet, text that is not UTF-8, a missing column, an unknown play),
each refused naming the value or the file, with nothing on disk changed."""

from __future__ import annotations

import pytest
from refusals import Case, refused_clearly_and_unchanged, text_file

import hf_posenc as hp
from hf_posenc.corpora import load_corpus

CASES = [
    Case("corpus-none", lambda c: load_corpus(None), hp.InvalidInputError, "got None"),
    Case("corpus-empty-string", lambda c: load_corpus(""), hp.InvalidInputError, "got ''"),
    Case("corpus-blank", lambda c: load_corpus("  "), hp.InvalidInputError, "a corpus is"),
    Case("corpus-int", lambda c: load_corpus(3), hp.InvalidInputError, "got 3"),
    Case("corpus-malformed-jsonl", lambda c: load_corpus(str(c.path)), hp.InvalidInputError,
         "a.jsonl cannot be read as JSON", setup=text_file("a.jsonl", b'{"text": "a"}\n{bad\n')),
    Case("corpus-undecodable-txt", lambda c: load_corpus(str(c.path)), hp.InvalidInputError,
         "a.txt cannot be read as UTF-8 text", setup=text_file("a.txt", b"\xff\xfe\xfa\x80abc")),
    Case("corpus-one-bad-file-of-two", lambda c: load_corpus(str(c.path.parent / "*.txt")), hp.InvalidInputError,
         "b.txt cannot be read as UTF-8 text",
         setup=lambda p: (text_file("a.txt", b"fine")(p), text_file("b.txt", b"\xff\xfe")(p))[1]),
    Case("corpus-malformed-parquet", lambda c: load_corpus(str(c.path)), hp.InvalidInputError,
         "a.parquet cannot be read as Parquet", setup=text_file("a.parquet", b"garbage")),
    Case("corpus-text-column-missing", lambda c: load_corpus(str(c.path), text_column="body"), hp.InvalidInputError,
         "has no column 'body'", setup=text_file("a.jsonl", b'{"text": "a"}\n')),
    Case("corpus-unknown-play", lambda c: load_corpus("shakespeare:nosuch"), hp.InvalidInputError,
         "no play(s) ['nosuch']"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(case, tmp_path):
    refused_clearly_and_unchanged(case, tmp_path)


def test_a_spec_that_names_local_files_and_finds_none_is_told_apart_from_a_hub_name(tmp_path):
    """One rule for the recipes' checks: a folder, a path or a glob that holds no corpus file is refused, a built-in
    or a hub dataset's name is not a path."""
    from hf_posenc.corpora import names_missing_files

    (tmp_path / "empty").mkdir()
    (tmp_path / "a.txt").write_text("some text\n")
    assert names_missing_files(str(tmp_path / "empty")) and names_missing_files("./nowhere/*.txt")
    assert names_missing_files(str(tmp_path / "b.txt")) and names_missing_files("/" + "x" * 5000 + ".txt")
    assert not any(names_missing_files(spec) for spec in (str(tmp_path / "a.txt"), str(tmp_path / "*.txt"),
                                                          str(tmp_path), "kjv", "kjv:genesis", "org/dataset"))


SHARED = [("kjv", "kjv", True), ("kjv", "stdlib", False), ("shakespeare:hamlet", "shakespeare", True),
          ("shakespeare:hamlet", "shakespeare:lear", False), ("shakespeare:hamlet,lear", "shakespeare:lear", True),
          ("shakespeare:-hamlet", "shakespeare:lear", True), ("shakespeare:-hamlet", "shakespeare:hamlet", False),
          ("shakespeare:-hamlet", "shakespeare:-lear", True), ("kjv: john", "kjv:john", True),
          ("shakespeare:nosuch", "shakespeare", False), ("org/data", "org/data", True),
          ("org/data", "org/other", False),
          ("{d}", "{d}/", True), ("{d}/a.txt", "{d}", True), ("{d}/*.txt", "{d}", True),
          ("{d}/b.txt", "{d}/a.txt", False), ("{d}", "{e}", False), ("kjv", "{d}", False)]


@pytest.mark.parametrize("spec, other, shared", SHARED)
def test_shares_text_reads_two_specs_as_the_text_they_name(tmp_path, spec, other, shared):
    """Whether a judge's text is held out: built-in parts by the documents they choose, local files however their
    path is spelled; a hub dataset by its name."""
    from hf_posenc.corpora import shares_text

    for name in ("d", "e"):
        (tmp_path / name).mkdir()
        for file in ("a.txt", "b.txt"):
            (tmp_path / name / file).write_text(f"{name} {file}\n")
    spec, other = (s.format(d=tmp_path / "d", e=tmp_path / "e") for s in (spec, other))
    assert shares_text(spec, other) == shared and shares_text(other, spec) == shared


def test_text_key_names_the_files_a_spec_reads_without_their_path(tmp_path, monkeypatch):
    """A run's record of its texts: one key however the same files are spelled, another for other files of the same
    names, no machine path; a built-in corpus or a hub name as given."""
    from hf_posenc.corpora import text_key

    for name in ("d", "e"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text(f"{name}\n")
    monkeypatch.chdir(tmp_path)
    key = text_key(str(tmp_path / "d"))
    assert key.startswith("a.txt (local ") and str(tmp_path) not in key
    assert {text_key(s) for s in ("d", "d/", "./d", "d/*.txt")} == {key}
    assert text_key("e").startswith("a.txt (local ") and text_key("e") != key   # the same name elsewhere
    for i in range(4):
        (tmp_path / "e" / f"{i}.txt").write_text("more\n")
    assert text_key("e").startswith("5 files in e (local ")
    assert [text_key(s) for s in ("kjv", "shakespeare:hamlet", "org/data")] == ["kjv", "shakespeare:hamlet", "org/data"]
