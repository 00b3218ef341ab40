"""benchmarks/common.results_file (issue 31, item 6): a benchmark's resumable results file. Two runs on one file
share it only when their settings are the same; a run that finds another run's settings, at the start or at a
save, refuses (one `error:` line, exit 2) and the file keeps the other run's cells. A file that is not a results
file, and a path that cannot hold one, are refused the same way, the file untouched."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import common  # noqa: E402  (benchmarks/common.py: the scripts run as `python benchmarks/bench_x.py`)

SETTINGS = {"dtype": "float32", "lengths": [1024, 2048], "target": 16384}
SECTIONS = ["perplexity", "passkey"]


def refused(capsys, fn, *args) -> str:
    """The one stderr line of a refusal (exit code 2)."""
    with pytest.raises(SystemExit) as exit_:
        fn(*args)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_a_new_file_saves_and_a_rerun_goes_on_from_it(tmp_path):
    out = tmp_path / "sub" / "r.json"
    results, save = common.results_file(out, SETTINGS, SECTIONS)
    assert results == {"settings": SETTINGS, "perplexity": {}, "passkey": {}}
    results["perplexity"]["yarn"] = 3.5
    save()
    again, _ = common.results_file(out, SETTINGS, SECTIONS)
    assert again["perplexity"] == {"yarn": 3.5}


def test_two_runs_with_the_same_settings_keep_each_others_cells(tmp_path):
    out = tmp_path / "r.json"
    a, save_a = common.results_file(out, SETTINGS, SECTIONS)
    b, save_b = common.results_file(out, SETTINGS, SECTIONS)
    a["perplexity"]["yarn"] = 1.0
    save_a()
    b["perplexity"]["ntk"] = 2.0
    save_b()
    assert json.loads(out.read_text())["perplexity"] == {"yarn": 1.0, "ntk": 2.0}


def test_a_run_whose_settings_differ_from_the_file_is_refused_naming_the_key(tmp_path, capsys):
    out = tmp_path / "r.json"
    results, save = common.results_file(out, SETTINGS, SECTIONS)
    results["perplexity"]["yarn"] = 1.0
    save()
    before = out.read_bytes()
    line = refused(capsys, common.results_file, out, SETTINGS | {"target": 32768}, SECTIONS)
    assert "target 16384 there, 32768 here" in line and "another --out" in line
    assert out.read_bytes() == before


def test_two_runs_with_other_settings_on_one_new_file_the_later_save_refuses(tmp_path, capsys):
    """The issue's case: both open a new --out; the second save used to replace the first run's cells, exit 0."""
    out = tmp_path / "r.json"
    a, save_a = common.results_file(out, SETTINGS, SECTIONS)
    b, save_b = common.results_file(out, SETTINGS | {"dtype": "bfloat16"}, SECTIONS)
    a["perplexity"]["yarn"] = 1.0
    save_a()
    before = out.read_bytes()
    b["perplexity"]["yarn"] = 9.0
    line = refused(capsys, save_b)
    assert "saved meanwhile by a run with other settings" in line and "dtype 'float32' there, 'bfloat16' here" in line
    assert out.read_bytes() == before
    a["perplexity"]["ntk"] = 2.0   # the first run goes on
    save_a()
    assert json.loads(out.read_text())["perplexity"] == {"yarn": 1.0, "ntk": 2.0}


@pytest.mark.parametrize("content,says", [
    (b"", "empty"),
    (b'{"settings": {"dtype": "float32"}, "perplexity": {"yarn": 1.', "not JSON"),
    (b"[1, 2]", "a JSON list"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not UTF-8"),
    (b'{"settings": [1], "perplexity": {}}', "'settings' is a list"),
    (b'{"settings": {}, "perplexity": 3}', "'perplexity' is a number"),
], ids=["empty", "truncated", "list", "binary", "settings-list", "section-number"])
def test_a_file_that_is_not_a_results_file_is_refused_untouched(tmp_path, capsys, content, says):
    out = tmp_path / "r.json"
    out.write_bytes(content)
    line = refused(capsys, common.results_file, out, SETTINGS, SECTIONS)
    assert says in line and str(out) in line
    assert out.read_bytes() == content


def test_a_file_spoilt_between_saves_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "r.json"
    results, save = common.results_file(out, SETTINGS, SECTIONS)
    out.write_text("[]")
    refused(capsys, save)
    assert out.read_text() == "[]"


def test_a_section_the_file_lacks_starts_empty(tmp_path):
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"settings": SETTINGS, "perplexity": {"yarn": 1.0}}))
    results, _ = common.results_file(out, SETTINGS, SECTIONS)
    assert results["perplexity"] == {"yarn": 1.0} and results["passkey"] == {}


def test_a_folder_as_the_path_or_a_file_as_its_parent_is_refused(tmp_path, capsys):
    assert "is a folder" in refused(capsys, common.results_file, tmp_path, SETTINGS, SECTIONS)
    parent = tmp_path / "results"
    parent.write_text("not a folder")
    line = refused(capsys, common.results_file, parent / "deeper" / "r.json", SETTINGS, SECTIONS)
    assert f"{parent} is a file" in line and parent.read_text() == "not a folder"


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_nan_or_infinite_setting_is_refused_by_name(tmp_path, capsys, value):
    line = refused(capsys, common.results_file, tmp_path / "r.json", SETTINGS | {"factor": value}, SECTIONS)
    assert f"setting factor is {value!r}" in line and "finite" in line
    assert not (tmp_path / "r.json").exists()


def test_a_setting_json_cannot_hold_is_refused_by_name(tmp_path, capsys):
    line = refused(capsys, common.results_file, tmp_path / "r.json", SETTINGS | {"plays": {"hamlet"}}, SECTIONS)
    assert "setting plays is {'hamlet'}, a set" in line


def test_tuple_settings_match_the_lists_the_file_reads_back(tmp_path):
    out = tmp_path / "r.json"
    results, save = common.results_file(out, SETTINGS | {"lengths": (1024, 2048)}, SECTIONS)
    results["perplexity"]["yarn"] = 1.0
    save()
    again, _ = common.results_file(out, SETTINGS | {"lengths": (1024, 2048)}, SECTIONS)   # a rerun, not "other"
    assert again["perplexity"] == {"yarn": 1.0}


def test_true_and_1_are_different_settings(tmp_path, capsys):
    out = tmp_path / "r.json"
    common.results_file(out, SETTINGS | {"flag": True}, SECTIONS)[1]()
    assert "flag True there, 1 here" in refused(capsys, common.results_file, out, SETTINGS | {"flag": 1}, SECTIONS)


def test_a_benchmark_refusal_is_one_line_and_exit_2(tmp_path):
    """As a script sees it: the process ends with exit code 2 and one `error:` line, no traceback."""
    out = tmp_path / "r.json"
    out.write_text("{")
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import common; "
            f"common.results_file({str(out)!r}, {{}}, [])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr


def test_an_unknown_method_ends_a_benchmark_script_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_long_context.py"), "--methods", "yarnn",
                           "--out", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown method 'yarnn'"), proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "r.json").exists()


def test_run_ends_an_hf_posenc_error_as_a_refusal_and_lets_a_bug_raise(capsys):
    from hf_posenc.errors import UnknownMethodError

    def bad_input():
        raise UnknownMethodError("unknown method 'yarnn';\n known: yarn")

    def bug():
        raise KeyError("a bug, not bad input")

    assert refused(capsys, common.run, bad_input) == "error: unknown method 'yarnn'; known: yarn"
    with pytest.raises(KeyError):
        common.run(bug)
    assert common.run(lambda: 3) == 3


@pytest.mark.parametrize("script", sorted(p.stem for p in BENCHMARKS.glob("bench_*.py")))
def test_every_benchmark_runs_through_common_run(script):
    """Each script's entry point is common.run(main), so an hf_posenc error ends it in one `error:` line
    (bench_s2_attention re-executes itself before torch loads and refuses by its own checks)."""
    if script == "bench_s2_attention":
        pytest.skip("imports common only after its re-exec; its refusals are tested above")
    source = (BENCHMARKS / f"{script}.py").read_text()
    assert "common.run(main)" in source.split('if __name__ == "__main__":')[-1], script


@pytest.mark.parametrize("script", sorted(p.stem for p in BENCHMARKS.glob("bench_*.py")))
def test_every_benchmark_imports(script):
    """A benchmark is run by hand, weeks after a refactor: its imports are checked here (bench_learned_long
    imported a module that a split had removed)."""
    import importlib

    module = importlib.import_module(script)
    assert callable(getattr(module, "main", None)), f"{script} has no main()"


def test_longce_weights_counts_a_copy_only_when_the_short_context_lacks_it():
    """bench_longce_weights's copies: token t is a copy when its g-gram was last seen before t's short context
    began ((t - window) // stride * stride, where LongCE's short window for t starts)."""
    import bench_longce_weights

    seq = [5, 9, 0, 0, 0, 0, 5, 7]    # window 2, stride 2: tokens 4.. have a short context, t=6 starts at 4
    flags = bench_longce_weights.copies(seq, first=4, window=2, stride=2)
    assert flags[1] == [False, False, True, False]      # the 5 at t=6 was last seen at 0; the 0s are near
    assert flags[2] == [False, False, False, False]     # (0, 5) and the rest: never seen before
    seq = [1, 2, 8, 8, 8, 8, 1, 2]
    assert bench_longce_weights.copies(seq, first=4, window=2, stride=2)[2][3]   # (1, 2) at t=7: seen at 1


def test_recall_pool_pairs_the_passages_of_every_seed_and_refuses_a_seed_twice(tmp_path, capsys):
    import bench_recall

    def cell(gaps):
        return {"passages": [{"distance": 20000, "gap": g} for g in gaps]}

    def results(seed, a):
        return {"settings": {"seed": seed, "passages": 48}, "recall": {"a 32768": cell(a), "b 32768": cell([0.5] * 5)},
                "probes": {}}

    ours = results(0, [1.0] * 5)
    (tmp_path / "s1.json").write_text(json.dumps(results(1, [2.0] * 5)))
    sets, seeds = bench_recall.pool_sets(ours, [str(tmp_path / "s1.json")])
    bench_recall.pooled(sets, seeds, [("a", "b")])
    out = capsys.readouterr().out
    assert "| a | 32768 | 1.50 +- " in out and "(n 10)" in out
    assert "a - b (all, n 10): +1.000" in out           # (0.5 x 5 + 1.5 x 5) / 10
    (tmp_path / "s0.json").write_text(json.dumps(results(0, [2.0] * 5)))
    with pytest.raises(SystemExit):
        bench_recall.pool_sets(ours, [str(tmp_path / "s0.json")])
    assert "seed 0 again" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [(["--warmup", "-1"], "--warmup must be >= 0"),
                                        (["--repeats", "0"], "--repeats must be >= 1")])
def test_bench_s2_attention_refuses_bad_counts_in_one_line_before_building_a_model(argv, says, capsys):
    import bench_s2_attention

    with pytest.raises(SystemExit) as done:
        bench_s2_attention.main(["--lengths", "4096", "--group", "1024", "--longce-window", "1024", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and err == [f"error: {says}, got {argv[1]}"]


@pytest.mark.parametrize("rows, says", [(["s2=FOLDER"], "is a folder without config.json: not a saved model"),
                                        (["yarnn"], "unknown method 'yarnn'"),
                                        (["=FOLDER"], "a row is a method (none, yarn, dca, ...) or NAME=FOLDER"),
                                        (["yarn", "a=SAVED", "a=SAVED"], "two rows share a name")])
def test_bench_recall_refuses_a_row_it_cannot_load_before_loading_anything(tmp_path, capsys, rows, says):
    """A fine-tune still training (its folder has no config.json yet) is refused in one line, not found out
    by a traceback once the corpus is tokenized."""
    import bench_recall

    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "config.json").write_text("{}")
    rows = [r.replace("FOLDER", str(tmp_path)).replace("SAVED", str(tmp_path / "saved")) for r in rows]
    assert says in refused(capsys, bench_recall.check_rows, rows)
    bench_recall.check_rows(["none", "yarn", f"ft={tmp_path / 'saved'}"])   # each of its kinds passes
