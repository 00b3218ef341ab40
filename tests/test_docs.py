"""The documentation speaks for the code: README.md starts with the two commands CI and users run, every
relative link in README.md, docs/ and benchmarks/RESULTS.md reaches a file (and a heading, for #anchors),
RESULTS.md's summary gives each interval as the section it links states it, README and the docs page of its kind name every method the package registers, no page counts the methods in
prose (a count goes stale with the next method), README names every model_type a family matches, and
docs/ARCHITECTURE.md's worked examples (methods, a training loss, a RULER task family) are the files the suite
runs (tests/examples/), and docs/rope_methods.md lists the parameters dynamic_yarn takes."""

import dataclasses
import re
from pathlib import Path

import examples
import pytest

from hf_posenc.attention import AttentionMethodConfig
from hf_posenc.config import LearnedMethodConfig, RopeMethodConfig
from hf_posenc.families.rope_models import TESTED_MODEL_TYPES
from hf_posenc.registry import FAMILIES, METHODS, get_method

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
README = (ROOT / "README.md").read_text(encoding="utf-8")
ARCHITECTURE = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
# the methods the package ships (its own modules; not the worked examples tests/conftest.py registers)
SHIPPED = sorted(n for n, cls in METHODS.items() if cls.__module__.startswith("hf_posenc.methods."))
# each kind of method (hf_posenc/config.py) and the page that documents the methods of that kind
KIND_PAGES = {RopeMethodConfig: "docs/rope_methods.md", LearnedMethodConfig: "docs/learned_tables.md",
              AttentionMethodConfig: "docs/attention_methods.md"}


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
    assert commands == ["bash scripts/setup.sh && hf-posenc demo", "bash scripts/setup.sh && python -m pytest -n 2"]
    ci = (ROOT / ".ci" / "run").read_text()   # CI runs the command README gives
    assert "bash scripts/setup.sh" in ci and re.search(r"^python -m pytest( -q)? -n 2$", ci, re.M), ci



def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file does not exist, or whose #anchor names no heading of that file."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = broken_links(page)
    assert not broken, broken


def test_a_broken_link_is_caught(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Its part: a title\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#its-part-a-title), [ok](#page), [web](https://example.org/a#b)\n"
                    "[gone](missing.md) [no heading](other.md#its-part) [none here](#nowhere)\n", encoding="utf-8")
    assert broken_links(page) == ["missing.md: no such file", "other.md#its-part: no heading #its-part in other.md",
                                  "#nowhere: no heading #nowhere in page.md"]


RESULTS = ROOT / "benchmarks" / "RESULTS.md"
ANCHOR_LINK = re.compile(r"\]\(#([^)\s]+)\)")   # a link to a heading of the same page: its anchor
INTERVAL = re.compile(r"[+-]?\d+(?:\.\d+)? \[[+-]?\d+(?:\.\d+)?, [+-]?\d+(?:\.\d+)?\]")


def sections(text: str) -> dict[str, str]:
    """Each heading's anchor -> its text, up to the next heading of its level or above (its subsections included),
    with runs of white space as one space (a figure may wrap)."""
    lines = text.splitlines()
    heads = [(i, len(m.group(1)), slug(m.group(2))) for i, line in enumerate(lines)
             if (m := re.match(r"(#+) (.*)", line))]
    found = {}
    for k, (i, level, anchor) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1:] if lv <= level), len(lines))
        found.setdefault(anchor, " ".join(" ".join(lines[i + 1:end]).split()))
    return found


def summary_entries(text: str) -> list[str]:
    """The rows of RESULTS.md's summary table and the items of its superseded answers (a list item with its
    wrapped lines)."""
    summary = text.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| question ")]
    superseded = text.split("\n# Superseded answers\n", 1)[1].split("\n# ", 1)[0]
    items = re.findall(r"^- .*?(?=^- |\Z)", superseded, re.M | re.S)
    return rows + items


def uncopied_figures(entry: str, text: str) -> list[str]:
    """The intervals an entry gives that no section it links states, word for word."""
    found = sections(text)
    linked = [found[a] for a in ANCHOR_LINK.findall(entry) if a in found]
    if not linked:
        return [f"links no section of RESULTS.md: {entry[:80]}"]
    return [f for f in INTERVAL.findall(" ".join(entry.split())) if not any(f in s for s in linked)]


def test_the_summary_states_each_interval_as_the_section_it_links():
    """A summary row (or a superseded answer) copies its figures from the sections it links: an interval they do not
    state is a figure rounded differently or gone stale."""
    text = RESULTS.read_text(encoding="utf-8")
    entries = summary_entries(text)
    assert len(entries) >= 6, entries
    problems = {entry[:80]: wrong for entry in entries if (wrong := uncopied_figures(entry, text))}
    assert not problems, problems


def unlisted_sections(text: str) -> dict[str, list[str]]:
    """The measured sections (### headings) that the dated log or the sections by topic do not link."""
    measured = {slug(m.group(1)) for m in re.finditer(r"^### (.*)$", text, re.M)}
    lists = {"the dated log": text.split("\n# The dated log\n", 1)[1],
             "sections by topic": text.split("\n## Sections by topic\n", 1)[1].split("\n## ", 1)[0]}
    return {name: sorted(measured - set(ANCHOR_LINK.findall(part))) for name, part in lists.items()}


def test_the_dated_log_and_the_topics_list_every_section():
    """RESULTS.md says the dated log lists every section: a new section is added to it and to its topic."""
    assert unlisted_sections(RESULTS.read_text(encoding="utf-8")) == {"the dated log": [], "sections by topic": []}


def test_an_interval_its_section_does_not_state_is_caught():
    text = RESULTS.read_text(encoding="utf-8")
    row = ("| q | +0.72 [+0.58, +0.85] past 16k; +0.72 [+0.58, +0.86] |"
           " [recall](#recall-at-a-distance-the-training-free-rows-re-judged-with-intervals) |")
    assert uncopied_figures(row, text) == ["+0.72 [+0.58, +0.86]"]
    assert uncopied_figures("| q | +0.72 [+0.58, +0.85] | none |", text)[0].startswith("links no section")


@pytest.mark.parametrize("method", SHIPPED)
def test_readme_names_every_method_in_its_table(method):
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", README, re.M)}
    assert method in rows, f"README.md's method table has no row | `{method}` | ... |"


@pytest.mark.parametrize("method", SHIPPED)
def test_the_serving_table_says_what_every_method_exports_to(method):
    """docs/serving.md's table (vLLM, llama.cpp, GGUF) has a row naming each method: a new method gets one, or the
    page is silent on what a user can serve."""
    page = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    named = {name.strip() for m in re.finditer(r"^\| ([a-z_0-9, ]+) \|", page, re.M) for name in m.group(1).split(",")}
    assert method in named, f"docs/serving.md's table (| method | vLLM | llama.cpp | GGUF |) has no row naming {method!r}"


def prose(page: str) -> str:
    """The page without its code blocks."""
    return re.sub(r"^```.*?^```", "", page, flags=re.M | re.S)


def missing_from_its_page(method: str) -> str | None:
    """What is wrong when the docs page of `method`'s kind does not name it (as `name`, outside code); None when it does."""
    page = next((page for kind, page in KIND_PAGES.items() if issubclass(METHODS[method], kind)), None)
    if page is None:
        return f"{method}: a kind of method without a docs page; add it to KIND_PAGES in tests/test_docs.py"
    if f"`{method}`" not in prose((ROOT / page).read_text(encoding="utf-8")):
        return f"{page} does not name method {method!r} (as `{method}`): give it a row or a section there"
    return None


@pytest.mark.parametrize("method", SHIPPED)
def test_the_docs_page_of_its_kind_names_every_method(method):
    problem = missing_from_its_page(method)
    assert problem is None, problem


def test_a_method_missing_from_its_page_is_caught():
    # the worked example `reflect` (a table method, registered for the tests only) is on no docs page
    assert "docs/learned_tables.md does not name method 'reflect'" in missing_from_its_page("reflect")
    assert missing_from_its_page("tile") is None


NUMBER = (r"(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
          r"seventeen|eighteen|nineteen|twenty)")
# "Eight methods rescale ...", "18 methods", "six attention methods": a count of the registry, stale with the next
COUNT = re.compile(rf"\b{NUMBER}\s+(?:(?:RoPE|rope|scaling|learned-table|table|attention|registered)\s+)?methods\b",
                   re.I)
COUNTED_PAGES = ["README.md", "docs/ARCHITECTURE.md", *KIND_PAGES.values()]


@pytest.mark.parametrize("page", COUNTED_PAGES)
def test_no_page_counts_the_methods(page):
    counts = COUNT.findall(prose((ROOT / page).read_text(encoding="utf-8")))
    assert not counts, f"{page} counts methods in prose ({counts}): the next method makes it wrong; drop the count"


def test_a_count_of_methods_is_caught():
    assert COUNT.findall("Eight methods rescale RoPE. 18 methods. Six attention methods work.") == [
        "Eight methods", "18 methods", "Six attention methods"]
    assert not COUNT.findall("Two more (`dca`, `self_extend`) and the methods below")


# docs/ARCHITECTURE.md: a link to a worked example, then (after prose without code) the Python block that shows it
EXAMPLE_BLOCK = re.compile(r"\]\(\.\./tests/examples/(\w+)\.py\)(?:(?!```).)*?```python\n(.*?)^```", re.M | re.S)


# the worked examples ARCHITECTURE.md links and shows whole, by the name they register (the position scheme's block,
# shown without its docstring, is tests/test_positions.py's to check)
WORKED = {**examples.EXAMPLES, **examples.LOSS_EXAMPLES, **examples.TASK_EXAMPLES}


@pytest.mark.parametrize("name", sorted(WORKED))
def test_architecture_shows_each_worked_example_as_the_file_the_suite_runs(name):
    shown = dict(EXAMPLE_BLOCK.findall(ARCHITECTURE))
    module = WORKED[name].__module__.rpartition(".")[2]
    assert module in shown, f"docs/ARCHITECTURE.md shows no block after a link to ../tests/examples/{module}.py"
    assert shown[module] == (ROOT / "tests" / "examples" / f"{module}.py").read_text(encoding="utf-8"), (
        f"docs/ARCHITECTURE.md's block of tests/examples/{module}.py differs from the file: copy the file into it")


def test_every_worked_example_file_is_shown():
    modules = sorted(cls.__module__.rpartition(".")[2] for cls in WORKED.values())
    assert sorted(dict(EXAMPLE_BLOCK.findall(ARCHITECTURE))) == modules


def test_readme_names_every_model_type_a_family_matches():
    model_types = set(TESTED_MODEL_TYPES) | {t for f in FAMILIES.values() if f.mechanism == "learned" for t in f.model_types}
    missing = sorted(t for t in model_types if not re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", README))
    assert not missing, missing


def test_readme_leads_with_what_it_does_a_working_example_and_where_to_go_next():
    """The first screen: purpose, the two commands (install and run), the example test_doc_blocks runs
    (README.md:0: patch, fine-tune, evaluate, save), and the next steps, all within 40 lines."""
    first = README.splitlines()[:40]
    text = "\n".join(first)
    assert first[0] == "# hf_posenc" and "```python" in text and "Next:" in text
    example = README.split("```python", 1)[1].split("```", 1)[0]
    for call in ("hp.patch(", ".backward()", "hpe.perplexity_by_length(", "save_pretrained("):
        assert call in example, call


def test_no_anchor_of_results_or_docs_carries_a_date_or_an_issue_number():
    """Section titles say what was measured; the date, the machine and the issue go in the section's first line, so
    a link to a section survives the next measurement's retitling."""
    pages = [ROOT / "benchmarks" / "RESULTS.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    dated = {page.name: sorted(a for a in anchors(page) if re.search(r"\d{4}-\d\d-\d\d|issue-\d", a))
             for page in pages}
    assert {name: found for name, found in dated.items() if found} == {}


def test_docs_list_exactly_the_parameters_dynamic_yarn_takes():
    """docs/rope_methods.md's row names the method's own parameters (those beyond what every RoPE method takes)."""
    row = next(line for line in (ROOT / "docs" / "rope_methods.md").read_text().splitlines()
               if line.startswith("| `dynamic_yarn` |"))
    listed = set(re.findall(r"`(\w+)`", row.split(" | ")[3]))
    shared = {f.name for f in dataclasses.fields(get_method("ntk"))}
    own = {f.name for f in dataclasses.fields(get_method("dynamic_yarn"))} - shared
    assert own <= listed and "attention_factor" in listed  # named, as refused
    assert "attention_factor" not in own
