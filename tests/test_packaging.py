"""What `pip install` and a package index get: the license, the type marker, the docs README
links to, and a public face without internals. And the sdist as a checkout: unpacked, README's
first commands (`bash scripts/setup.sh && python -m pytest`) find what they need: the script, the tests with their
helpers (conftest.py, tiny.py, the worked examples) and data, the benchmarks README and the docs link to
(RESULTS.md and its results), the recipe shims. Builds the sdist and the wheel with setuptools from a copy of the
tree (a few seconds, no network), and collects the unpacked sdist's tests."""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import hf_posenc as hp

ROOT = Path(__file__).resolve().parents[1]


# What the sdist is built from: the top-level files and folders of a checkout (also of an unpacked sdist)
SOURCES = ("pyproject.toml", "README.md", "CONTRIBUTING.md", "LICENSE", "MANIFEST.in", "hf_posenc", "docs", "tests", "benchmarks",
           "recipes", "scripts")
# What a checkout holds that is no source: caches, a build's leftovers, a benchmark's lock and half-written copy
NOT_SOURCE = ("__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info", "*.pyc", ".*.lock", ".*.tmp")
# The folders README's commands and links need in the unpacked sdist, shipped whole
CHECKOUT_FOLDERS = ("tests", "benchmarks", "recipes", "scripts", "docs")


def source_files(folder: str) -> set[str]:
    """The files of a source folder of this checkout (links followed: recipes/accelerate is one), as paths
    relative to the root."""
    ignored = shutil.ignore_patterns(*NOT_SOURCE)
    found = set()
    for path in sorted((ROOT / folder).rglob("*")):
        parts = path.relative_to(ROOT).parts
        if path.is_file() and not any(ignored(str(ROOT.joinpath(*parts[:i])), [parts[i]])
                                      for i in range(len(parts))):
            found.add(path.relative_to(ROOT).as_posix())
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the sdist's file names, the wheel's, the wheel's METADATA, the sdist's path)"""
    pytest.importorskip("setuptools")
    tree = tmp_path_factory.mktemp("tree")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, tree / name, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
        elif (ROOT / name).exists():
            shutil.copy(ROOT / name, tree / name)
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
        return sdist_files, set(wheel.namelist()), wheel.read(metadata).decode(), out / sdist_name


def test_the_license_ships_in_wheel_and_sdist(built):
    sdist, wheel, metadata, _ = built
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "LICENSE" in sdist
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel), sorted(wheel)
    assert "License-Expression: Apache-2.0" in metadata  # PEP 639, not the deprecated table


def test_the_type_marker_ships(built):
    sdist, wheel, _, _ = built
    assert "hf_posenc/py.typed" in wheel and "hf_posenc/py.typed" in sdist


def test_the_sdist_holds_the_docs_readme_links_to(built):
    sdist, _, _, _ = built
    linked = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert linked and linked <= sdist, sorted(linked - sdist)


@pytest.mark.parametrize("folder", CHECKOUT_FOLDERS)
def test_the_sdist_holds_every_file_of_the_folders_readme_needs(built, folder):
    sdist = built[0]
    files = source_files(folder)
    assert files and files <= sdist, sorted(files - sdist)


def test_the_sdist_holds_the_test_helpers_and_the_first_command(built):
    """By name, the files an sdist once lacked: without them the tests could not import and README's first
    command failed."""
    named = {"tests/conftest.py", "tests/tiny.py", "scripts/setup.sh", "benchmarks/RESULTS.md", "benchmarks/common.py",
             "recipes/finetune.py", "recipes/evaluate.py", "recipes/accelerate/ddp.yaml"}
    assert named <= built[0], sorted(named - built[0])


def test_every_relative_link_of_readme_and_docs_resolves_in_the_sdist(built):
    sdist = built[0]
    link = re.compile(r"\]\(([^)\s#]+)[^)\s]*\)")
    broken = []
    for page in ("README.md", "benchmarks/RESULTS.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))):
        for target in link.findall((ROOT / page).read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
            if resolved not in sdist and not any(n.startswith(resolved + "/") for n in sdist):
                broken.append(f"{page}: {target}")
    assert not broken, broken


def test_the_unpacked_sdist_collects_its_tests(built, tmp_path):
    """Every test module of the unpacked sdist imports (conftest.py, tiny.py, the examples, the data it reads at
    import): `python -m pytest --collect-only` there, with the sdist's own hf_posenc first on the path."""
    with tarfile.open(built[3]) as sdist:
        sdist.extractall(tmp_path, filter="data")
    unpacked = next(tmp_path.iterdir())
    env = {**os.environ, "PYTHONPATH": str(unpacked), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=unpacked, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert {line.split("::")[0] for line in collected} == {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")}


def test_readme_install_block_installs_the_extra_the_embedded_model_needs():
    """The embedded smollm2 is a GGUF file, which transformers reads only with the gguf package: README's install
    block names the `gguf` extra (and only extras pyproject declares)."""
    import tomllib

    from hf_posenc import assets

    assert assets.SMOLLM2_FILE.endswith(".gguf")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Install", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    extras = {extra for group in re.findall(r'pip install -e "\.\[([\w,]+)\]"', block) for extra in group.split(",")}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "gguf" in extras and extras <= set(declared), (extras, sorted(declared))


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
