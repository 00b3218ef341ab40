"""What `pip install` and a package index get (issue 23, item 17): the license, the type marker, the docs README
links to, and a public face without internals. Builds the sdist and the wheel with setuptools from a copy of
the tree (a few seconds, no network)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import hf_posenc as hp

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("setuptools")
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, tree / name)
    for folder in ("hf_posenc", "docs"):
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    code = ("import sys; from setuptools import build_meta as b; out = sys.argv[1]; "  # (build_meta rewrites sys.argv)
            "s = b.build_sdist(out); w = b.build_wheel(out); print(f'BUILT {s} {w}')")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=tree, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sdist_name, wheel_name = next(x for x in proc.stdout.splitlines() if x.startswith("BUILT ")).split()[1:]
    with tarfile.open(out / sdist_name) as sdist, zipfile.ZipFile(out / wheel_name) as wheel:
        sdist_files = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        return sdist_files, set(wheel.namelist()), wheel.read(metadata).decode()


def test_the_license_ships_in_wheel_and_sdist(built):
    sdist, wheel, metadata = built
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "LICENSE" in sdist
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel), sorted(wheel)
    assert "License-Expression: Apache-2.0" in metadata  # PEP 639, not the deprecated table


def test_the_type_marker_ships(built):
    sdist, wheel, _ = built
    assert "hf_posenc/py.typed" in wheel and "hf_posenc/py.typed" in sdist


def test_the_sdist_holds_the_docs_readme_links_to(built):
    sdist, _, _ = built
    linked = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert linked and linked <= sdist, sorted(linked - sdist)


def test_pyproject_uses_the_license_expression():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_the_public_face_is_all_and_submodules_stay_reachable():
    assert set(dir(hp)) == {*hp.__all__, "__version__"}
    for internal in ("api", "plan", "registry", "loading", "serving", "errors", "families"):
        assert internal not in dir(hp)
    import hf_posenc.eval
    import hf_posenc.registry

    assert hf_posenc.registry.get_method("yarn").name == "yarn" and hasattr(hf_posenc.eval, "perplexity_by_length")
    assert all(getattr(hp, name) is not None for name in hp.__all__)


def test_every_public_function_has_a_docstring():
    undocumented = [n for n in hp.__all__ if callable(getattr(hp, n)) and not (getattr(hp, n).__doc__ or "").strip()]
    assert not undocumented, undocumented
