"""benchmarks/bench_recall.py --report: every file, cell and row name it is given is read and checked before it prints
anything; what it cannot report (a file that is not there, a cell cut short or without its gap, a row no cell
holds, pooled files with no cell in common) ends it in one `error:` line, exit code 2, naming the file and the
cell or the flag and the name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from refusals import one_line_refusal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_recall  # noqa: E402  (benchmarks/bench_recall.py: the scripts run as `python benchmarks/bench_x.py`)
import common  # noqa: E402

from hf_posenc.eval import stats  # noqa: E402

PASSAGES = 5   # at 16k: one sequence of 5 passages a cell
SETTINGS = {"passages": PASSAGES, "passage_tokens": 192, "control": True, "corpus": "kjv", "seed": 0,
            "dtype": "float32"}


def cell(mean: float, passages: int = PASSAGES) -> dict:
    gaps = [mean + 0.1 * i for i in range(passages)]
    return {"gap": stats.bootstrap_mean(gaps), "bins": [{"start": 0, "end": 8192, **stats.bootstrap_mean(gaps)}],
            "recall_distance": 8192, "beyond_measured": True, "cpu_s": 1.0,
            "passages": [{"sequence": 0, "passage": i, "distance": 1000 + 1000 * i, "gap": g}
                         for i, g in enumerate(gaps)]}


def results_file(path: Path, cells: dict, seed: int = 0) -> Path:
    path.write_text(json.dumps({"settings": {**SETTINGS, "seed": seed}, "recall": cells, "probes": {}}))
    return path


def run_report(monkeypatch, argv: list[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_recall.py", "--report", "--dtype", "float32", "--passages",
                                      str(PASSAGES), *argv])
    common.run(bench_recall.main)


@pytest.fixture
def out(tmp_path):
    return results_file(tmp_path / "r.json", {"yarn 16384": cell(1.0), "dca 16384": cell(0.5),
                                              "ntk 32768": cell(0.2)})


def test_a_whole_file_is_reported_with_the_pairs_asked(out, monkeypatch, capsys):
    run_report(monkeypatch, ["--out", str(out), "--pairs", "yarn:dca"])
    said = capsys.readouterr()
    assert "| yarn | 16384 | 1.20 +- " in said.out and "16384: yarn - dca (all, n 5): +0.500" in said.out
    assert not said.err


@pytest.mark.parametrize("argv, says", [
    (["--pairs", "yarn:nosuchrow"], "--pairs yarn:nosuchrow: no row 'nosuchrow' in {out} (its rows: dca, ntk, "
                                    "yarn)"),
    (["--pairs", "yarn:ntk"], "--pairs yarn:ntk: the two rows share no length in {out} (yarn at 16384; ntk at "
                              "32768)"),
    (["--figure", "{tmp}/f.png", "--figure-rows", "nosuchrow"], "--figure-rows nosuchrow: no row 'nosuchrow' in "
                                                                "{out}"),
    (["--figure-rows", "yarn"], "--figure-rows goes with --figure"),
    (["--also", "{tmp}/missing.json"], "--also {tmp}/missing.json: no such results file"),
    (["--pool", "{tmp}/other.json"], "--pool {tmp}/other.json: no cell (row and length) is in --out and every --pool "
                                     "file, so there is nothing to pool"),
    (["--pool", "{tmp}/seed1.json", "--pairs", "yarn:dca"], "--pairs yarn:dca: no row 'dca' in the cells --out and "
                                                            "every --pool file share (its rows: yarn)"),
], ids=["pair-row", "pair-length", "figure-rows", "figure-rows-alone", "also-missing", "pool-nothing-shared",
        "pool-pair-row"])
def test_a_name_or_file_the_report_would_leave_out_is_refused_in_one_line(out, tmp_path, monkeypatch, capsys, argv,
                                                                           says):
    """Each of these printed a report with the row, the file or the pool left out, exit 0, no word."""
    results_file(tmp_path / "other.json", {"longce 16384": cell(0.3)}, seed=1)
    results_file(tmp_path / "seed1.json", {"yarn 16384": cell(1.1)}, seed=1)
    before = sorted(tmp_path.iterdir())
    argv = [a.format(tmp=tmp_path) for a in argv]
    line = one_line_refusal(capsys, lambda _: run_report(monkeypatch, ["--out", str(out), *argv]), None, alone=True)
    assert line.startswith("error: " + says.format(out=out, tmp=tmp_path)), line
    assert sorted(tmp_path.iterdir()) == before


def test_a_missing_out_file_is_refused_and_not_made(tmp_path, monkeypatch, capsys):
    line = one_line_refusal(capsys, lambda _: run_report(monkeypatch, ["--out", str(tmp_path / "r.json")]), None,
                            alone=True)
    assert line == f"error: --out {tmp_path / 'r.json'}: no such results file (--report reads the cells a run saved " \
                   f"there)"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("change, says", [
    (lambda c: c.pop("passages"), "has no passages (a list of distance and gap each)"),
    (lambda c: c.update(passages=c["passages"][:3]), "holds 3 passages; a cell of 5 passages at 16384 holds 5: cut "
                                                     "short"),
    (lambda c: c["passages"][1].update(gap=None), "has no passages (a list of distance and gap each)"),
    (lambda c: c.update(gap=None), "has gap None, not an interval (n, mean, half_width)"),
    (lambda c: c.pop("bins"), "lacks bins"),
], ids=["no-passages", "passages-short", "passage-gap-null", "gap-null", "no-bins"])
@pytest.mark.parametrize("where", ["--out", "--also", "--pool"])
def test_a_cell_that_is_not_whole_is_refused_naming_the_file_and_the_cell(tmp_path, monkeypatch, capsys, change,
                                                                          says, where):
    """A cell without passages or with fewer was left out of its pairs without a word; a null gap ended in a
    refusal of interval_text that named neither the file nor the cell."""
    broken = cell(0.7)
    change(broken)
    good = {"yarn 16384": cell(1.0), "dca 16384": cell(0.5)}
    files = {"--out": good, "--also": {"self_extend 16384": cell(0.9)}, "--pool": {"yarn 16384": cell(1.1)}}
    files[where] = {**files[where], "bad 16384": broken}
    paths = {flag: results_file(tmp_path / f"{flag[2:]}.json", cells, seed=1 if flag == "--pool" else 0)
             for flag, cells in files.items()}
    argv = [a for flag, path in paths.items() for a in (flag, str(path))]
    line = one_line_refusal(capsys, lambda _: run_report(monkeypatch, argv), None, alone=True)
    assert line.startswith(f"error: {paths[where]}: the cell 'bad 16384' {says}"), line
