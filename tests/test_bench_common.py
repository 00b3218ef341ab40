"""benchmarks/common.results_file: a benchmark's resumable results file. Two runs on one file
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
from tiny import tiny_tokenizer  # noqa: E402

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
    """Both open a new --out; the second save used to replace the first run's cells, exit 0."""
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


def test_run_ends_a_usage_error_of_the_front_ends_checks_as_a_refusal(capsys):
    """hf_posenc.user_input's checks (an output folder that is a file, a model path that is not there) raise a
    UsageError, a ValueError and no PosEncError: a benchmark that calls them ends in one line too, not a traceback."""
    from hf_posenc import user_input

    def bad_folder():
        user_input.output_folder(__file__, "--out")

    assert refused(capsys, common.run, bad_folder) == f"error: --out {__file__} is a file; name a folder"


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
    bench_recall.check_rows(["none", "yarn", "yarn_switched", f"ft={tmp_path / 'saved'}"])   # each of its kinds passes


# -- every flag refused in one line before anything loads ---------------------------------------------------------

def script_refusal(capsys, monkeypatch, module, argv: list[str]) -> str:
    """The one `error:` line (exit code 2) of a benchmark script's main() on argv; nothing loads before it."""
    import hf_posenc as hp

    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    monkeypatch.setattr(hp, "load_tokenizer", lambda *a, **k: pytest.fail("a tokenizer loaded"))
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        module.main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("argv, says", [
    (["--passages", "0"], "error: argument --passages: must be >= 1, got 0 (see bench_recall.py --help)"),
    (["--passages", "x"], "error: argument --passages: must be an integer, got 'x'"),
    (["--dtype", "float8"], "error: argument --dtype: invalid choice: 'float8' (choose from 'auto', 'float32', "
                            "'bfloat16', 'float16')"),
    (["--probes", "-1"], "error: argument --probes: must be >= 0, got -1"),
    (["--probes", "1"], "error: --probes must be 0 (none) or in 2..16 (multikey's keys), got 1"),
    (["--probes", "17"], "error: --probes must be 0 (none) or in 2..16 (multikey's keys), got 17"),
    (["--lengths", "1"], "error: argument --lengths: must be >= 2, got 1"),
    (["--text-ids", "/missing/ids.npy"], "error: --text-ids /missing/ids.npy: no such file"),
    (["--bogus"], "error: unrecognized arguments: --bogus"),
])
def test_bench_recall_refuses_a_bad_flag_in_one_line_before_anything_loads(tmp_path, capsys, monkeypatch, argv, says):
    """--passages 0 ended in a ZeroDivisionError, --dtype float8 in an AttributeError, --probes -1 was checked only
    after every recall cell."""
    import bench_recall

    said = script_refusal(capsys, monkeypatch, bench_recall, ["--rows", "none", "--out", str(tmp_path / "r.json"),
                                                              *argv])
    assert said.startswith(says), said
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("content, says", [(b"\x00\x01garbage", "is not a .npy array of token ids"),
                                           (None, "holds float64 of shape (2, 3), not one row of integer token ids")])
def test_bench_recall_refuses_text_ids_that_are_not_token_ids(tmp_path, capsys, monkeypatch, content, says):
    """A corrupt --text-ids file ended in numpy's traceback after the tokenizer loaded."""
    import bench_recall
    import numpy

    path = tmp_path / "ids.npy"
    path.write_bytes(content) if content is not None else numpy.save(path, numpy.zeros((2, 3)))
    said = script_refusal(capsys, monkeypatch, bench_recall, ["--rows", "none", "--out", str(tmp_path / "r.json"),
                                                              "--text-ids", str(path)])
    assert says in said, said
    assert not (tmp_path / "r.json").exists()


def test_bench_recall_refuses_passages_the_text_cannot_hold_before_a_model_loads(tmp_path, capsys, monkeypatch):
    import bench_recall
    import numpy

    numpy.save(tmp_path / "ids.npy", numpy.arange(5000) % 200)
    monkeypatch.setattr(bench_recall, "load_row", lambda *a, **k: pytest.fail("a model loaded"))
    monkeypatch.setattr(bench_recall.hp, "load_tokenizer", lambda ref: tiny_tokenizer())
    monkeypatch.setattr(sys, "argv", ["bench_recall.py", "--rows", "none", "--lengths", "4096", "--passages", "1000",
                                      "--dtype", "float32", "--text-ids", str(tmp_path / "ids.npy"),
                                      "--out", str(tmp_path / "r.json")])
    with pytest.raises(SystemExit) as stop:
        common.run(bench_recall.main)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("error: the recall text has 5000 tokens"), err


def test_bench_recall_report_draws_one_figure_a_length(tmp_path, monkeypatch, capsys):
    """--report --figure ended in a NameError (the lengths were never named in report())."""
    import bench_recall

    from hf_posenc.eval import plots

    drawn = []
    monkeypatch.setattr(plots, "plot_recall", lambda variants, path, **k: drawn.append((sorted(variants), path)))
    from hf_posenc.eval import stats

    cell = {"bins": [], "recall_distance": 100, "beyond_measured": False, "cpu_s": 1, "passages": [],
            "gap": stats.bootstrap_mean([1.0, 2.0, 1.5, 1.2, 0.8])}
    results = {"recall": {"none 16384": cell, "yarn 16384": cell, "yarn 32768": cell}, "probes": {}}
    bench_recall.report(results, str(tmp_path / "fig.png"))
    assert drawn == [(["none", "yarn"], tmp_path / "fig_16k.png"), (["yarn"], tmp_path / "fig_32k.png")]


@pytest.mark.parametrize("argv, says", [
    (["--dtype", "float8"], "error: argument --dtype: invalid choice: 'float8'"),
    (["--samples", "0"], "error: argument --samples: must be >= 1, got 0"),
    (["--families", "single"], "error: --families single hide their needles in real text: give --haystack FILE"),
    (["--haystack", "/missing.txt"], "error: --haystack /missing.txt: no such file"),
])
def test_bench_ruler_refuses_a_bad_flag_in_one_line_before_anything_loads(capsys, monkeypatch, argv, says):
    import bench_ruler

    assert script_refusal(capsys, monkeypatch, bench_ruler, argv).startswith(says)


def extend_run(folder: Path, short: bool = True, judge_corpus: str = "kjv") -> Path:
    """An `hf-posenc extend` run's folder as bench_extend_variants reads it: its plan and stage checkpoints' configs."""
    from hf_posenc import user_input
    from hf_posenc.recipes.extend import model_key

    (folder / "plan.json").parent.mkdir(parents=True)
    settings = {"search": True, "target": 256, "judge.seeds": 2, "train.short_steps": 1 if short else 0,
                "judge.rows": ["yarn", "self_extend"], "judge.corpus": judge_corpus}
    (folder / "plan.json").write_text(json.dumps({"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                  "model_path": model_key(user_input.model_ref("smollm2")),
                                                  "settings": settings}))
    for stage, rope in (("search/best", "longrope"), ("finetune", "longrope"), *([("short", "longrope")] * short)):
        (folder / stage).mkdir(parents=True)
        (folder / stage / "config.json").write_text(json.dumps({"rope_parameters": {"rope_type": rope}}))
    return folder


def test_bench_extend_variants_reads_the_runs_checkpoint_from_its_last_trained_stage(tmp_path):
    import bench_extend_variants as bench

    run = extend_run(tmp_path / "run")
    rows = bench.run_rows(run, "smollm2", {"search": True, "train.short_steps": 10})
    assert rows["extended"] == (str(run / "short"), False) and rows["finetune"] == (str(run / "finetune"), False)
    assert rows["start"] == (str(run / "search" / "best"), False)
    alone = extend_run(tmp_path / "alone", short=False)   # train.short_steps 0: the fine-tune is the checkpoint
    for settings in ({"search": False, "train.short_steps": 0}, {"search": False}):   # or planned before the stage
        assert bench.run_rows(alone, "smollm2", settings) == {"unpatched": ("smollm2", False),
                                                              "extended": (str(alone / "finetune"), False)}


def test_bench_extend_variants_reads_the_judges_perplexity_windows_not_its_own(capsys):
    """One answer per question: the unpatched model's and the checkpoint's windows are the judge's cells (the card's
    +1 % figure), measured here only where the judge has not; every other row reads the same windows."""
    import bench_extend_variants as bench

    def cell(*nll):
        return {"length": 64, "offsets": [0, 500], "nll": list(nll)}

    judged = {"base/short_perplexity": cell(2.0, 2.2), "extended/short_perplexity": cell(2.1, 2.2),
              "start/perplexity": {"lengths": [64], "perplexity": [9.0]}}
    assert bench.todo_cells("unpatched", False, 2, {}, judged) == []
    assert bench.todo_cells("extended", False, 2, {}, judged) == []
    assert bench.todo_cells("extended", False, 2, {}, {}) == ["short_perplexity"]   # the judge has not run it yet
    assert bench.todo_cells("start", False, 2, {}, judged) == ["short_perplexity"]
    assert bench.todo_cells("mine", False, 2, {"mine/recall_seed0": {}}, judged) == ["short_perplexity", "recall_seed1"]
    assert bench.todo_cells("mine", True, 2, {}, judged) == ["short_perplexity"]   # switched: recall is the folder's
    rows = {"unpatched": ("smollm2", False), "extended": ("run/short", False), "start": ("run/search/best", False)}
    measured = {"start/short_perplexity": cell(2.2, 2.4), "extended/short_perplexity": cell(9.0, 9.0)}
    bench.report(rows, {"target": 256, "judge.seeds": 2, "judge.bin": 64}, judged, measured)
    out = capsys.readouterr().out
    assert "unpatched      8.166" in out   # exp(2.1): the judge's windows
    assert "extended       8.585  unpatched +5.1%" in out   # the judge's cell wins over one measured before it
    assert "start          9.974  unpatched +22.1%" in out and "extended +16.2%" in out


@pytest.mark.parametrize("argv, says", [
    (["--rows", "a=MISSING"], "error: row a: no checkpoint at MISSING (no config.json)"),
    (["--rows", "finetune=RUN/short"], "error: row 'finetune=RUN/short': a row is NAME=FOLDER or NAME=FOLDER:switched, "
                                       "its NAME new (not unpatched, extended, start, finetune, yarn, self_extend)"),
    (["--rows", "self_extend=RUN/short"], "error: row 'self_extend=RUN/short': a row is"),   # the judge's row
    (["--model", "YARN"], "error: --model YARN is not the model the run extended "
                          "(HuggingFaceTB/SmolLM2-135M-Instruct)"),
    (["--judge_corpus", "HELD"], "error: --judge_corpus HELD reads a.txt (local "),
    (["--rows", "a=RUN/short:twisted"], "error: row 'a=RUN/short:twisted': a row is"),
    (["--rows", "a=YARN:switched"], "error: row a: YARN carries 'yarn', not longrope: nothing to switch"),
    (["--rows", "a=FOURX:switched"], "error: row a: FOURX carries 'linear', not longrope: nothing to switch"),
    (["--out", "RUN/plan.json"], "error: --out RUN/plan.json is inside the run's folder"),
])
def test_bench_extend_variants_refuses_in_one_line_before_anything_loads(tmp_path, capsys, monkeypatch, argv, says):
    import bench_extend_variants as bench
    import hf_posenc as hp

    run = extend_run(tmp_path / "run")
    (tmp_path / "yarn").mkdir()
    (tmp_path / "yarn" / "config.json").write_text(json.dumps({"rope_parameters": {"rope_type": "yarn"}}))
    (tmp_path / "old").mkdir()   # transformers 4.x's spelling
    (tmp_path / "old" / "config.json").write_text(json.dumps({"rope_scaling": {"type": "linear", "factor": 2.0}}))
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "a.txt").write_text("words\n")
    names = {"RUN": str(run), "MISSING": str(tmp_path / "missing"), "YARN": str(tmp_path / "yarn"),
             "FOURX": str(tmp_path / "old"), "HELD": str(tmp_path / "held")}
    for key, value in names.items():
        argv, says = [a.replace(key, value) for a in argv], says.replace(key, value)
    monkeypatch.setattr(hp, "from_pretrained", lambda *a, **k: pytest.fail("a model loaded"))
    full = ["--run", str(run), "--out", str(tmp_path / "out.json"), *argv]
    assert script_refusal(capsys, monkeypatch, bench, full).startswith(says)
    assert not (tmp_path / "out.json").exists()


def test_bench_extend_variants_reads_a_local_judge_text_only_when_named(tmp_path, capsys, monkeypatch):
    """plan.json names local texts without their path: the bench asks for them, and takes only those files."""
    import bench_extend_variants as bench
    from hf_posenc import corpora

    for name in ("held", "other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text("words\n")
    key = corpora.text_key(str(tmp_path / "held"))
    assert bench.judge_text({"judge.corpus": key}, str(tmp_path / "held" / "a.txt")) == str(tmp_path / "held" / "a.txt")
    assert bench.judge_text({"judge.corpus": "kjv"}, None) == "kjv"
    assert refused(capsys, bench.judge_text, {"judge.corpus": key}, None) == (
        f"error: the run's judge text is local files ({key}): name them with --judge_corpus")
    assert refused(capsys, bench.judge_text, {"judge.corpus": key}, str(tmp_path / "other")).startswith(
        f"error: --judge_corpus {tmp_path / 'other'} reads a.txt (local ")


def test_bench_extend_variants_reads_the_bases_context_from_any_model(tmp_path):
    """The original context the perplexity windows take: the embedded model (a GGUF asset) and a model with one RoPE
    per layer type (Gemma 3's text config), not a fine-tune's config keys."""
    import bench_extend_variants as bench
    from transformers import Gemma3TextConfig

    assert bench.original_context("smollm2") == 8192
    Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=16, max_position_embeddings=96).save_pretrained(tmp_path)
    assert bench.original_context(str(tmp_path)) == 96


def test_common_refuses_a_dtype_it_does_not_know_by_name(capsys):
    assert refused(capsys, common.dtype_name, "float8") == ("error: --dtype must be one of auto, float32, bfloat16, "
                                                            "float16, got 'float8'")
    assert common.dtype_name("float32") == "float32" and common.dtype_name(None) in ("float32", "bfloat16")


@pytest.mark.parametrize("script", sorted(p.stem for p in BENCHMARKS.glob("bench_*.py")))
def test_every_benchmark_refuses_its_flags_in_one_line(script):
    """argparse's own refusals (a value of the wrong type, an unknown flag) print a usage line first and name the
    script: common.ArgumentParser makes them one `error:` line, as every other refusal (bench_s2_attention
    re-executes itself before it imports common, and refuses by its own checks)."""
    if script == "bench_s2_attention":
        pytest.skip("parses before its re-exec, without common")
    source = (BENCHMARKS / f"{script}.py").read_text()
    assert "argparse.ArgumentParser(" not in source and "common.ArgumentParser(" in source, script


def test_bench_short_to_long_refuses_train_args_before_any_fine_tune(tmp_path, capsys, monkeypatch):
    """A --train-args the recipe refuses ended in a CalledProcessError traceback, after the child's own line."""
    import bench_short_to_long

    monkeypatch.setattr(bench_short_to_long.subprocess, "run", lambda *a, **k: pytest.fail("a fine-tune started"))
    monkeypatch.setattr(sys, "argv", ["bench_short_to_long.py", "--rows", "c=contiguous", "--only", "train", "--out",
                                      str(tmp_path / "s.json"), "--runs", str(tmp_path / "runs"), "--train-args",
                                      "--train.steps", "0"])
    with pytest.raises(SystemExit) as stop:
        common.run(bench_short_to_long.main)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1, lines
    assert lines[0] == "error: row 'c=contiguous' (--train-args --train.steps 0): train.steps must be >= 1, got 0"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("code, says", [(2, None), (1, "error: the fine-tune of row 'c=contiguous' ended with exit "
                                                       "code 1 (its output is above); rerun to resume it")])
def test_a_fine_tune_that_fails_ends_the_benchmark_in_one_line(tmp_path, capsys, monkeypatch, code, says):
    """Code 2: the recipe's own `error:` line is the one line (nothing added); another code: one line of ours."""
    import argparse

    import bench_short_to_long

    monkeypatch.setattr(bench_short_to_long.subprocess, "run",
                        lambda command: subprocess.CompletedProcess(command, code))
    args = argparse.Namespace(runs=str(tmp_path / "runs"), train_args=[])
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        bench_short_to_long.finetune("c=contiguous", args)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "Traceback" not in err
    assert err == "" if says is None else err.startswith(says)
