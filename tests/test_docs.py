"""The documentation speaks for the code: README.md starts with the two commands CI and users run, every
relative link in README.md, docs/ and benchmarks/RESULTS.md reaches a file (and a heading, for #anchors),
and README names every registered method and every model_type a family matches."""

import re
from pathlib import Path

import pytest

import hf_posenc as hp
from hf_posenc.families.rope_models import TESTED_MODEL_TYPES
from hf_posenc.registry import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#+ (.*)", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def test_readme_starts_with_the_two_commands():
    first_block = README.split("```")[1].splitlines()
    commands = [line.split("#")[0].strip() for line in first_block[1:] if line.strip()]
    assert commands == ["bash scripts/setup.sh && hf-posenc demo", "bash scripts/setup.sh && python -m pytest"]



@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, broken


def test_readme_names_every_method_in_its_table():
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", README, re.M)}
    missing = [m["name"] for m in hp.list_methods() if m["name"] not in rows]
    assert not missing, missing


def test_readme_names_every_model_type_a_family_matches():
    model_types = set(TESTED_MODEL_TYPES) | {t for f in FAMILIES if f.mechanism == "learned" for t in f.model_types}
    missing = sorted(t for t in model_types if not re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", README))
    assert not missing, missing
