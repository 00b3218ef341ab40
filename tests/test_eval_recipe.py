"""recipes/evaluate.py, the local `evaluate` perplexity module and hf_posenc.corpora on a tiny checkpoint
saved with a byte-level tokenizer and a corpus of local text files; the recipe given bad input, as a hostile new
user would type it (one `error:` line, exit code 2, nothing on disk changed, in this process and in a shell), and
the tracebacks and silent answers it once gave: a learned-table model whose variant extends its table (the time
estimate ran the model as loaded past its table), an encoder (refused before loading), a length far past every
context (refused before any input is built), a resume with changed settings (each named with both values;
settings no asked measure reads ignored), results.json as strict JSON (NaN written as null with a note, read back
on a rerun), and the "to do" line of a resumed run (what is left)."""

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import datasets
import pytest
import torch
from transformers import AutoConfig, AutoModel

import hf_posenc as hp
import hf_posenc.metrics
from hf_posenc import corpora
from hf_posenc import eval as hpe
from hf_posenc.eval import ruler
from hf_posenc.recipes import evaluate_config
from refusals import (CallCase, check_refusal, one_line_refusal, refused_in_one_line, root,  # noqa: F401 (fixtures)
                      shell_refusal)
from tiny import TINY_TEXT_VOCAB, checkpoint, save_text_models, tiny_model, tiny_tokenizer, write_corpus  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("eval_recipe", ROOT / "hf_posenc" / "recipes" / "evaluate.py")
recipe = sys.modules["eval_recipe"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)

TEXT = "".join(f"Line {i}: the {['king', 'queen', 'fool'][i % 3]} speaks of {i * 7 % 13} ravens.\n" for i in range(60))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), TEXT)


def run(checkpoint, corpus_dir, out, *extra):
    return recipe.main([
        "--model.name", str(checkpoint), "--model.dtype", "float32", "--data.corpus", str(corpus_dir),
        "--output_dir", str(out), "--eval.variants", "none", "yarn", "dynamic_yarn", "--eval.max_position_embeddings", "256",
        "--eval.curve_length", "256", "--eval.curve_bucket", "64", "--eval.strided_windows", "64",
        "--eval.strided_tokens", "300", "--eval.passkey_lengths", "350", "--eval.needle_lengths", "450",
        "--eval.depths", "0.5", *extra])


def test_recipe_writes_results_summary_and_figures(checkpoint, corpus_dir, tmp_path, monkeypatch):
    results = run(checkpoint, corpus_dir, tmp_path)
    assert set(results["variants"]) == {"none", "yarn", "dynamic_yarn"}
    yarn = results["variants"]["yarn"]
    assert yarn["params"] == {"max_position_embeddings": 256} and yarn["describe"]["factor"] == 4.0
    assert results["variants"]["dynamic_yarn"]["curve"]["prefix"] is True
    # the recorded curve is what hpe computes on the first corpus document
    model, tok = hp.load_model(checkpoint), tiny_tokenizer()
    docs = [tok(TEXT, add_special_tokens=False)["input_ids"]]
    with hpe.variant(model, "yarn", 256):
        expected = hpe.perplexity_curve(model, docs, length=256, bucket=64, progress=False)
    assert yarn["curve"]["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-4)
    assert 0 <= yarn["passkey"]["by_length"][0] <= 1 and yarn["needle"]["lengths"] == [450]
    assert yarn["strided"]["64"]["tokens"] == 299
    for name in ("results.json", "summary.md", "perplexity_curve.png", "passkey.png", "needle_depths.png"):
        assert (tmp_path / name).stat().st_size > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| yarn -> 256 | " in summary and "| none | " in summary and "positions >= 64" in summary
    # each measure's own time, not the variant's whole time
    assert {"curve", "strided 64", "passkey", "needle"} <= set(yarn["seconds_by_measure"])
    assert sum(yarn["seconds_by_measure"].values()) <= yarn["seconds"] + 0.2

    # a second run with the same configuration resumes: nothing is evaluated again
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("evaluated again"))
    assert run(checkpoint, corpus_dir, tmp_path)["variants"] == json.loads((tmp_path / "results.json").read_text())["variants"]


def test_recipe_config_yaml_then_command_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("eval:\n  variants: [none, 'yarn beta_fast=16']\n  max_position_embeddings: [16384, 32768]\n"
                      "  curve_length: 4096\n")
    args = evaluate_config.parse_args(["--config", str(config), "--eval.curve_length", "2048"])
    assert (args.eval.variants, args.eval.curve_length, args.model.name) == (["none", "yarn beta_fast=16"], 2048, "smollm2")
    assert [label for label, _, _ in evaluate_config.variant_runs(args)] == ["none", "yarn beta_fast=16 @16384",
                                                                     "yarn beta_fast=16 @32768"]
    config.write_text("eval:\n  curve_lenght: 4096\n")
    with pytest.raises(recipe.ConfigError, match=r"section eval: unknown key\(s\) \['curve_lenght'\]"):
        evaluate_config.parse_args(["--config", str(config)])
    with pytest.raises(hp.UnknownMethodError, match="unknown method 'yarnn'"):
        evaluate_config.parse_args(["--eval.variants", "none", "yarnn"])


def base_args(checkpoint, corpus_dir, out):
    return ["--model.name", str(checkpoint), "--model.dtype", "float32", "--data.corpus", str(corpus_dir),
            "--output_dir", str(out), "--eval.max_position_embeddings", "256"]


def test_recipe_perplexity_by_length_and_a_grid_tuned_on_held_out_documents(checkpoint, corpus_dir, tmp_path):
    results = recipe.main([*base_args(checkpoint, corpus_dir, tmp_path), "--eval.variants", "none", "yarn",
                           "--eval.perplexity_lengths", "64", "128", "256", "--eval.perplexity_documents", "1",
                           "--eval.grid", "yarn beta_fast=8|32 attention_factor=1|1.2", "--eval.tune_documents", "1"])
    model, tok = hp.load_model(checkpoint), tiny_tokenizer()
    texts = corpora.load_corpus(str(corpus_dir))["text"]
    tune, held_out = ([tok(t, add_special_tokens=False)["input_ids"]] for t in texts)  # the tuning document first
    grid = results["grid"]["yarn beta_fast=8|32 attention_factor=1|1.2 @256"]
    assert [p["variant"] for p in grid["points"]] == [
        "yarn beta_fast=8 attention_factor=1", "yarn beta_fast=8 attention_factor=1.2",
        "yarn beta_fast=32 attention_factor=1", "yarn beta_fast=32 attention_factor=1.2"]
    for point in grid["points"]:  # each point: perplexity at the longest length on the tuning document
        with hpe.variant(model, point["variant"], 256):
            expected = hpe.document_perplexity(model, tune, max_length=256, progress=False)["perplexity"]
        assert point["perplexity"] == pytest.approx(expected, rel=1e-5)
    best = min(grid["points"], key=lambda p: p["perplexity"])
    assert grid["best"] == best["variant"]
    # the winner, as the hp.patch call the summary prints, evaluated on the held-out document
    assert grid["patch"].startswith("hp.patch(model, 'yarn', ")
    eval(grid["patch"], {"hp": hp, "model": model})
    expected = hpe.perplexity_by_length(model, held_out, [64, 128, 256], progress=False)["perplexity"]
    hp.unpatch(model)
    assert results["variants"][f"{best['variant']} (grid best)"]["lengths"]["perplexity"] == pytest.approx(expected, rel=1e-5)
    with hpe.variant(model, "yarn", 256):
        expected = hpe.perplexity_by_length(model, held_out, [64, 128, 256], progress=False)
    assert results["variants"]["yarn"]["lengths"]["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-5)
    summary = (tmp_path / "summary.md").read_text()
    assert "| 64 | 128 | 256 | how |" in summary and f"Best: `{grid['patch']}`" in summary
    assert (tmp_path / "perplexity_by_length.png").stat().st_size > 0


def refusal(capsys, argv) -> str:
    """The recipe's one-line refusal (exit code 2) of argv."""
    return one_line_refusal(capsys, recipe.main, argv)


def test_recipe_refuses_bad_input_before_any_compute(checkpoint, corpus_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("evaluated"))
    # lengths past a learned table: named, before anything runs or is written
    gpt2 = tmp_path / "gpt2"
    tiny_model("gpt2", vocab_size=TINY_TEXT_VOCAB).save_pretrained(gpt2)
    tiny_tokenizer().save_pretrained(gpt2)
    out = tmp_path / "out"
    args = [*base_args(gpt2, corpus_dir, out), "--eval.variants", "none", "sinusoidal", "--eval.perplexity_lengths", "128"]
    limit = hp.load_model(gpt2).config.n_positions
    assert re.search(rf"variant 'none' cannot take the 128 tokens .*{limit}", refusal(capsys, args))
    assert not out.exists()
    # a corpus too short: the documents that are
    assert re.search(r"needs 3 documents of >= 5000 tokens, 0 have them; too short \(tokens\): #0 \(\d+\), #1",
                     refusal(capsys, [*base_args(checkpoint, corpus_dir, out), "--eval.perplexity_lengths", "5000",
                                      "--eval.perplexity_documents", "3"]))
    # unknown keys and methods: the valid ones listed
    config = tmp_path / "c.yaml"
    config.write_text("eval:\n  perplexity_length: [64]\n")
    assert re.search(r"unknown key\(s\) \['perplexity_length'\]; the keys are: variants, .*perplexity_lengths",
                     refusal(capsys, ["--config", str(config)]))
    assert re.search(r"unknown method 'yarnn'; known: .*\byarn\b",
                     refusal(capsys, ["--eval.grid", "yarnn beta_fast=1|2"]))   # the list, whatever sorts first
    assert "key=value or key=value|value" in refusal(capsys, ["--eval.grid", "yarn beta_fast=16|", "--eval.tune_length", "64"])


def test_recipe_never_overwrites_results_of_another_configuration(checkpoint, corpus_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "results.json").write_text(json.dumps({"config": {"model": {"name": "other"}}, "variants": {"x": {}}}))
    before = (tmp_path / "results.json").read_text()
    monkeypatch.setattr(recipe.hp, "load_model", lambda *a, **k: pytest.fail("loaded"))
    args = [*base_args(checkpoint, corpus_dir, tmp_path), "--eval.variants", "none", "--eval.perplexity_lengths", "64"]
    said = refusal(capsys, args)   # each setting that differs, with both values
    assert f'already holds another configuration: model.name "other" -> "{checkpoint}", ' in said
    assert 'eval.variants ["none", "yarn"] -> ["none"]' in said and "pass --overwrite to replace it" in said
    assert (tmp_path / "results.json").read_text() == before
    monkeypatch.undo()
    results = recipe.main([*args, "--overwrite"])
    assert set(results["variants"]) == {"none"}
    assert json.loads((tmp_path / "results.json").read_text())["variants"].keys() == {"none"}


@pytest.mark.parametrize("path", sorted((ROOT / "recipes" / "configs").glob("eval*.yaml")), ids=lambda p: p.name)
def test_shipped_eval_configs_parse(path):
    args = evaluate_config.parse_args(["--config", str(path)])
    assert args.eval.variants and evaluate_config.variant_runs(args)


def test_perplexity_metric_loads_by_path_and_matches_document_perplexity(checkpoint):
    model, tok = hp.load_model(checkpoint), tiny_tokenizer()
    texts = [TEXT[:300], TEXT[100:250]]
    metric = hf_posenc.metrics.load("perplexity")
    out = metric.compute(predictions=texts, model=model, tokenizer=tok)
    docs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    expected = [hpe.document_perplexity(model, [d], max_length=64, progress=False)["perplexity"] for d in docs]
    assert out["perplexities"] == pytest.approx(expected, rel=1e-5)
    assert out["mean_perplexity"] == pytest.approx(sum(expected) / 2, rel=1e-5)
    patched = metric.compute(predictions=texts, model=model, tokenizer=tok, variant="yarn", max_position_embeddings=256)
    with hpe.variant(model, "yarn", 256):
        expected = [hpe.document_perplexity(model, [d], max_length=256, progress=False)["perplexity"] for d in docs]
    assert patched["perplexities"] == pytest.approx(expected, rel=1e-5)
    assert patched["tokens"] == 255 + 149 and hp.describe(model)["method"] is None  # scored in full, then unpatched
    with pytest.raises(ValueError, match="either model_id"):
        metric.compute(predictions=texts)


# -- hf_posenc.corpora --------------------------------------------------------------------------------

def test_load_corpus_from_local_files(tmp_path, corpus_dir):
    texts = corpora.load_corpus(str(corpus_dir))
    assert sorted(texts["text"]) == sorted([TEXT, TEXT[::-1]])  # one document per file, line breaks kept
    (tmp_path / "d.jsonl").write_text('{"body": "first doc"}\n{"body": "second doc"}\n')
    assert corpora.load_corpus(str(tmp_path / "*.jsonl"), text_column="body")["text"] == ["first doc", "second doc"]
    with pytest.raises(FileNotFoundError, match="no corpus files match"):
        corpora.load_corpus(str(tmp_path / "missing" / "*.txt"))
    with pytest.raises(ValueError, match="has no 'text' column"):
        corpora.load_corpus(str(tmp_path / "d.jsonl"))


def test_builtin_corpora():
    try:
        plays = corpora.load_corpus("shakespeare:hamlet,macbeth")
        bible = corpora.load_corpus("kjv:genesis,revelation")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    assert plays["title"][:] == ["hamlet", "macbeth"] and "Denmark" in plays["text"][0]
    assert bible["text"][0].startswith("1. In the beginning God created")
    assert bible["text"][1].endswith("with you all. Amen.") and "In the beginning" not in bible["text"][1]
    with pytest.raises(ValueError, match="no play\\(s\\) \\['hamlett'\\]"):
        corpora.load_corpus("shakespeare:hamlett")


def test_tokenize_keeps_documents_of_min_tokens():
    corpus = datasets.Dataset.from_dict({"text": ["abcdef", "xy", "0123456789"]})
    tokenized = corpora.tokenize(corpus, tiny_tokenizer(), min_tokens=5)
    assert tokenized["num_tokens"][:] == [6, 10]
    assert tokenized["input_ids"][0] == [64, 65, 66, 67, 68, 69]  # byte tokens: 'a' is 64 in this alphabet


# -- hf-posenc demo --------------------------------------------------------------------------------

def test_demo_on_a_tiny_checkpoint(checkpoint, corpus_dir, tmp_path, capsys, monkeypatch):
    from hf_posenc.cli import main
    from hf_posenc.eval import plots

    titles, plot = [], plots.plot_perplexity_by_length
    monkeypatch.setattr(plots, "plot_perplexity_by_length", lambda *a, **k: titles.append(k["title"]) or plot(*a, **k))
    main(["demo", "--model", str(checkpoint), "--corpus", str(corpus_dir / "a.txt"), "--dtype", "float32",
          "--tokens", "60", "--long-tokens", "512", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "1. Inside the original context" in printed and "| longrope | long_factor=ramp 1..2 |" in printed
    assert ("| variant | ppl 16 | ppl 32 | ppl 64 (context) | ppl 512 | ppl of tokens 64-512 only | how | time (s) |"
            in printed)  # no --passkey
    assert "--passkey (retrieval at the longest length" in printed
    # float32 on a CPU: YaRN is left out of part 2 by default (a long pass takes minutes there), and it says so
    assert "part 2 runs none, dca: in float32 on a CPU" in printed
    part2 = printed.split("2. Up to 512 tokens")[1]
    assert "| none |" in part2 and "| dca |" in part2 and "| yarn |" not in part2
    assert (tmp_path / "perplexity_by_length.png").exists()
    assert len(titles) == 1 and titles[0].endswith("every method patched to 128")  # the legend says "dca", not where to
    from hf_posenc import demo

    assert demo.default_long_variants(torch.bfloat16) == ("none", "yarn", "dca")

    printed_lines = []
    result = demo.run(str(checkpoint), tokens=60, long_tokens=512, methods=("yarn", "dynamic", "dynamic_yarn"),
                      long_variants=("none", "yarn", "dynamic_yarn"), passkey=True, dtype="float32",
                      corpus=str(corpus_dir / "a.txt"), out=None, print_fn=printed_lines.append)
    drift = {r["method"]: r["max_abs_logprob_drift"] for r in result["inside"]}
    assert drift["none"] == drift["dynamic"] == drift["dynamic_yarn"] == 0 < drift["yarn"]
    ids = tiny_tokenizer()(TEXT, add_special_tokens=False)["input_ids"]
    model = hp.load_model(checkpoint)
    assert result["inside"][0]["ppl"] == pytest.approx(
        hpe.document_perplexity(model, [ids], max_length=60, progress=False)["perplexity"], rel=1e-4)
    past = result["past"]
    assert set(past) == {"none", "yarn", "dynamic_yarn"} and past["none"]["lengths"]["lengths"] == [16, 32, 64, 512]
    assert past["none"]["lengths"]["perplexity"][-1] == pytest.approx(
        hpe.document_perplexity(model, [ids], max_length=512, progress=False)["perplexity"], rel=1e-4)
    assert past["yarn"]["lengths"]["one_pass"] and not past["dynamic_yarn"]["lengths"]["one_pass"]
    # inside the original context dynamic YaRN is the model itself; at the target it is static YaRN
    assert past["dynamic_yarn"]["lengths"]["perplexity"][:3] == pytest.approx(past["none"]["lengths"]["perplexity"][:3], rel=1e-5)
    assert past["dynamic_yarn"]["lengths"]["perplexity"][3] == pytest.approx(past["yarn"]["lengths"]["perplexity"][3], rel=1e-5)
    assert past["yarn"]["passkey"]["lengths"] == [512] and past["yarn"]["passkey"]["trials"] == 1
    # the tokens past the context on their own (the first 512's perplexity dilutes them with the first 64)
    nll = hpe.token_nll(model, torch.tensor([ids[:512]]))[0].double()
    assert past["none"]["past_only"] == pytest.approx(math.exp(nll[63:].mean().item()), rel=1e-4)
    assert past["dynamic_yarn"]["past_only"] is None   # a pass per length: no one pass to read them from
    assert any("| ppl 512 | ppl of tokens 64-512 only | passkey 512 (answer log-prob) | how |" in line
               for line in printed_lines)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--model", str(checkpoint), "--methods", "yarn,yarnn"])
    assert exit_.value.code == 2 and "error: unknown method 'yarnn'" in capsys.readouterr().err



def test_demo_asks_the_cpu_for_its_dtype_not_a_gpu_beside_it(checkpoint, corpus_dir, monkeypatch):
    """The demo runs on the CPU: with a bfloat16 GPU present and a CPU without native bfloat16, auto is float32."""
    from hf_posenc import _compat, demo

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_compat, "native_bfloat16", lambda device=None: (
        (False, "no native bfloat16 here") if str(device) == "cpu" else (True, "a GPU with bfloat16")))
    printed = []
    demo.run(str(checkpoint), tokens=40, methods=("yarn",), long_tokens=0, corpus=str(corpus_dir / "a.txt"),
             out=None, print_fn=printed.append)
    assert "dtype: float32 (auto: no native bfloat16 here)" in printed


def test_demo_shows_a_layer_progress_bar_for_each_long_pass(monkeypatch):
    """pass_progress (hf_posenc/eval/perplexity.py, the demo's and the search's): one bar per forward of at least
    min_tokens tokens (of the model or of its decoder alone), as many steps as attention layers; shorter forwards
    get none, and the hooks are gone after."""
    import torch

    from hf_posenc.eval import perplexity
    from tiny import tiny_model

    model = tiny_model(max_position_embeddings=128)
    seen = []

    class Bar:
        def __init__(self, total, desc, **_):
            self.total, self.desc, self.n = total, desc, 0
            seen.append(self)

        def update(self):
            self.n += 1

        def close(self):
            self.closed = True

    monkeypatch.setattr(perplexity, "tqdm", Bar)
    with torch.no_grad(), perplexity.pass_progress(model, "yarn", min_tokens=64):
        model(torch.randint(0, 100, (1, 80)))
        model(torch.randint(0, 100, (1, 10)))
        model.model(input_ids=torch.randint(0, 100, (1, 70)))  # the decoder alone, as the evaluation runs it
    assert [(b.desc, b.n, b.total) for b in seen] == [("yarn, 80-token pass", 2, 2), ("yarn, 70-token pass", 2, 2)]
    assert not any(m._forward_hooks or m._forward_hooks_with_kwargs for m in model.modules())



def test_demo_sizes_its_long_part_to_the_cpu():
    """Part 2 by this CPU's speed: twice the context when the unpatched model and DCA fit the time left, else 1.5
    times it whatever the time (shorter shows no break); one more variant only while the slowest timed pass fits."""
    import time

    from hf_posenc import demo

    context = 8192
    cost = lambda n: n * (0.002 + 1e-7 * n)   # seconds a pass of n tokens: ~59 s at 16k
    assert demo.plan_long_part(cost, 200, context) == (16384, ("none", "dca"))
    assert demo.plan_long_part(cost, 110, context) == (12288, ("none", "dca"))
    assert demo.plan_long_part(cost, 1, context) == (12288, ("none", "dca"))
    now = time.perf_counter()
    assert demo.fits_another([], None) and demo.fits_another([3.0, 5.0], now + 60)
    assert not demo.fits_another([3.0, 50.0], now + 30)


def test_demo_without_lengths_runs_what_fits(checkpoint, corpus_dir, tmp_path, monkeypatch):
    """No time at all: the unpatched model and DCA at 1.5 times the context (the break shows there), YaRN left out
    and said; all the time in the world: YaRN after them."""
    from hf_posenc import demo

    lines = []
    monkeypatch.setattr(demo, "TARGET_SECONDS", {"native bfloat16": 0.0, "float32": 0.0})
    monkeypatch.setattr(demo.loading, "resolve_dtype", lambda dtype, device: (torch.bfloat16, "test"))
    result = demo.run(str(checkpoint), tokens=40, methods=("yarn",), corpus=str(corpus_dir / "a.txt"),
                      dtype="auto", out=None, print_fn=lines.append)
    assert list(result["past"]) == ["none", "dca"] and result["past"]["none"]["lengths"]["lengths"][-1] == 96
    assert any(line.startswith("part 2 sized to this CPU") for line in lines)
    assert any("yarn left out: a 96-token pass took" in line for line in lines)
    monkeypatch.setattr(demo, "TARGET_SECONDS", {"native bfloat16": 1e6, "float32": 1e6})
    result = demo.run(str(checkpoint), tokens=40, methods=("yarn",), corpus=str(corpus_dir / "a.txt"),
                      dtype="auto", out=None, print_fn=lines.append)
    assert list(result["past"]) == ["none", "dca", "yarn"] and result["past"]["none"]["lengths"]["lengths"][-1] == 128


def test_bfloat16_is_not_native_where_torch_runs_below_avx512(monkeypatch):
    """A CPU with AMX whose torch kernels are held at AVX2 (ATEN_CPU_CAPABILITY=avx2) cannot run bfloat16
    attention ('pack_vnni2 is only supported when avx512 is supported'): auto picks float32 there."""
    import torch

    from hf_posenc import _compat

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    ok, why = _compat.native_bfloat16("cpu")
    assert not ok and "capability AVX2" in why
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert _compat.native_bfloat16("cpu")[0]


def test_the_demo_says_when_the_cpu_was_busy(monkeypatch):
    """Its 3 / 5 minute goals are for idle cores: a busy run says so beside its total time."""
    from hf_posenc import demo

    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(demo.os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    assert "the CPU was busy: load average 8.0 on 2 cores" in demo.busy_note()
    monkeypatch.setattr(demo.os, "getloadavg", lambda: (0.3, 0.3, 0.3))
    assert demo.busy_note() == ""


# -- bad input as a hostile new user would type it: one `error:` line, exit code 2, nothing on disk changed ---------

EVAL = ["--model.name", "{root}/llama", "--model.dtype", "float32", "--data.corpus", "{root}/corpus",
        "--output_dir", "{out}", "--eval.max_position_embeddings", "256"]

EVAL_CASES = [
    ("zero-length", [*EVAL, "--eval.perplexity_lengths", "0"], r"perplexity_lengths must hold token counts >= 2, got \[0\]"),
    ("zero-length-yaml", ["--config", "{root}/zero_length.yaml", "--output_dir", "{out}"],
     r"perplexity_lengths must hold token counts >= 2, got \[0\]"),
    ("dtype-float8", [*EVAL, "--model.dtype", "float8", "--eval.perplexity_lengths", "64"],
     r"dtype must be one of auto, float32, bfloat16, float16, got 'float8'"),
    ("framing-unknown", [*EVAL, "--data.framing", "always", "--eval.perplexity_lengths", "64"],
     r"framing must be one of auto, bos, none, got 'always'"),
    ("curve-bucket-zero", [*EVAL, "--eval.curve_length", "128", "--eval.curve_bucket", "0"], r"curve_bucket must be >= 1, got 0"),
    ("curve-length-negative", [*EVAL, "--eval.curve_length", "-5"], r"curve_length must be 0 \(off\) or a token count >= 2"),
    ("count-abc", [*EVAL, "--eval.curve_bucket", "abc"], r"--eval\.curve_bucket must be an integer, got 'abc'"),
    ("yaml-tab", ["--config", "{root}/tab.yaml"], r"tab.yaml is not valid YAML: .*line 2, column 1"),
    ("yaml-scalar-for-variants", ["--config", "{root}/scalar_variants.yaml"],
     r"scalar_variants.yaml: eval\.variants must be a list of strings \(YAML \[a, b, ...\], even for one\), got 'none'"),
    ("yaml-scalar-for-targets", ["--config", "{root}/scalar_targets.yaml"],
     r"max_position_embeddings must be a list of integers .*got 16384"),
    ("yaml-wrong-item-type", ["--config", "{root}/wrong_type.yaml"], r"perplexity_lengths must be a list of integers .*\['abc'\]"),
    ("yaml-bool-for-count", ["--config", "{root}/bool_count.yaml"], r"trials must be an integer, got True"),
    ("yaml-not-a-mapping", ["--config", "{root}/not_mapping.yaml"], r"must be a mapping of keys .*got \['variants', 'none'\]"),
    ("yaml-unknown-key", ["--config", "{root}/unknown_key.yaml"], r"section eval: unknown key\(s\) \['curve_lenght'\]; the keys are: .*curve_length"),
    ("yaml-missing", ["--config", "{root}/missing.yaml"], r"config file not found: .*missing.yaml"),
    ("no-targets", ["--config", "{root}/no_targets.yaml", "--output_dir", "{out}"], r"max_position_embeddings is empty"),
    ("no-variants", ["--config", "{root}/no_variants.yaml", "--output_dir", "{out}"], r"variants is empty: nothing to evaluate"),
    ("nothing-to-measure", [*EVAL, "--eval.variants", "none"], r"nothing to measure: set at least one of eval\.perplexity_lengths"),
    ("variant-twice", [*EVAL, "--eval.variants", "yarn", "yarn", "--eval.perplexity_lengths", "64"],
     r"variants lists a value twice: \['yarn', 'yarn'\]"),
    ("unknown-variant", [*EVAL, "--eval.variants", "yarnn", "--eval.perplexity_lengths", "64"], r"unknown method 'yarnn'"),
    ("unknown-variant-parameter", [*EVAL, "--eval.variants", "yarn betafast=3", "--eval.perplexity_lengths", "64"],
     r"unknown parameter\(s\) \['betafast'\] for method 'yarn'"),
    ("depth-past-one", [*EVAL, "--eval.passkey_lengths", "128", "--eval.depths", "2"], r"depths must be fractions in \[0, 1\], got \[2.0\]"),
    ("zero-trials", [*EVAL, "--eval.passkey_lengths", "128", "--eval.trials", "0"], r"trials must be >= 1, got 0"),
    ("zero-documents", [*EVAL, "--eval.perplexity_lengths", "64", "--eval.perplexity_documents", "0"],
     r"perplexity_documents must be >= 1, got 0"),
    ("stride-past-window", [*EVAL, "--eval.strided_windows", "64", "--eval.strided_stride", "100"],
     r"strided_stride must be 0 \(half the window\) or in 1..64"),
    ("window-zero", [*EVAL, "--eval.strided_windows", "0"], r"strided_windows must hold token counts >= 2, got \[0\]"),
    ("grid-without-length", [*EVAL, "--eval.grid", "yarn beta_fast=8|16"], r"grid needs eval\.tune_length"),
    ("empty-corpus", [*EVAL, "--data.corpus", "", "--eval.perplexity_lengths", "64"],
     r"data\.corpus must name a corpus \(built-in, local files or a hub dataset\), got ''"),
    ("missing-model", [*EVAL[:1], "/missing/path", *EVAL[2:], "--eval.perplexity_lengths", "64"],
     r"model '/missing/path': no such file or folder"),
    ("output-is-a-file", [*EVAL[:7], "{root}/afile", *EVAL[8:], "--eval.perplexity_lengths", "64"], r"output_dir .*afile is a file"),
    ("output-inside-the-model", [*EVAL[:7], "{root}/llama/eval", *EVAL[8:], "--eval.perplexity_lengths", "64"],
     r"output_dir .*llama/eval is or lies inside the input .*llama"),
    ("output-is-the-corpus", [*EVAL[:7], "{root}/corpus", *EVAL[8:], "--eval.perplexity_lengths", "64"],
     r"output_dir .*corpus is or lies inside the input .*corpus"),
    ("variant-not-applicable", [*EVAL, "--eval.variants", "none", "interpolate", "--eval.perplexity_lengths", "64"],
     r"method 'interpolate' applies to learned positions, but this llama model uses rope positions"),
    ("corrupt-results", [*EVAL[:7], "{root}/results", *EVAL[8:], "--eval.perplexity_lengths", "64"],
     r"results.json is not a results file of this recipe \(Expecting property name"),
    # after loading the model and tokenizer (still nothing written)
    ("missing-corpus", [*EVAL, "--data.corpus", "/missing/*.txt", "--eval.perplexity_lengths", "64"],
     r"no corpus files match '/missing/\*.txt'"),
    ("passkey-too-short", [*EVAL, "--eval.passkey_lengths", "5"],
     r"passkey_lengths \[5\]: length 5 is too short for the retrieval prompt"),
    ("documents-too-short", [*EVAL, "--eval.perplexity_lengths", "5000"], r"needs 2 documents of >= 5000 tokens, 0 have them"),
    ("bad-attention", [*EVAL, "--model.attn_implementation", "bogus", "--eval.perplexity_lengths", "64"], r"bogus"),
]
AFTER_LOADING = {"missing-corpus", "passkey-too-short", "documents-too-short"}


@pytest.mark.parametrize("argv,pattern", [c[1:] for c in EVAL_CASES], ids=[c[0] for c in EVAL_CASES])
def test_evaluate_refuses_with_one_line_and_changes_nothing(argv, pattern, root, capsys, monkeypatch):
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("measured"))
    name = next(c[0] for c in EVAL_CASES if c[1] is argv)
    check_refusal(recipe.main, argv, pattern, root, capsys, alone=name not in AFTER_LOADING)


# the same refusals as a shell sees them (a real process)
SUBPROCESS_CASES = [
    ("evaluate-yaml-tab", [sys.executable, str(ROOT / "recipes" / "evaluate.py"), "--config", "{root}/tab.yaml"],
     r"tab.yaml is not valid YAML"),
    ("evaluate-zero-length", [sys.executable, str(ROOT / "recipes" / "evaluate.py"), *EVAL, "--eval.perplexity_lengths", "0"],
     r"perplexity_lengths must hold token counts >= 2"),
]


@pytest.mark.parametrize("argv,pattern", [c[1:] for c in SUBPROCESS_CASES], ids=[c[0] for c in SUBPROCESS_CASES])
def test_a_shell_sees_exit_code_2_and_one_error_line(argv, pattern, root):
    shell_refusal(argv, pattern, root)


# -- a learned-table model whose variant extends its table, an encoder, a length far past every context, a resume
# with changed settings, results.json as strict JSON, and the "to do" line of a resumed run -------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Llama, a tiny GPT-2 (a 64-position table), a tiny BERT encoder, a Llama whose head gives NaN, and
    a corpus of two documents."""
    path = tmp_path_factory.mktemp("evaluate_recipe")
    nan = tiny_model(vocab_size=TINY_TEXT_VOCAB)
    with torch.no_grad():
        nan.lm_head.weight.fill_(float("nan"))
    bert = AutoModel.from_config(AutoConfig.for_model(
        "bert", vocab_size=TINY_TEXT_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64))
    save_text_models(path, llama=tiny_model(vocab_size=TINY_TEXT_VOCAB), nan=nan, bert=bert,
                     gpt2=tiny_model("gpt2", vocab_size=TINY_TEXT_VOCAB, bos_token_id=0, eos_token_id=0))
    write_corpus(path / "corpus", TEXT)
    return path


def argv(root, model: str, out, *extra) -> list[str]:
    return ["--model.name", str(root / model), "--model.dtype", "float32", "--data.corpus", str(root / "corpus"),
            "--output_dir", str(out), "--eval.max_position_embeddings", "256", "--plots", "false", *extra]


def no_loading(monkeypatch):
    monkeypatch.setattr(recipe.hp, "load_model", lambda *a, **k: pytest.fail("the weights loaded"))


def test_a_variant_that_extends_a_learned_table_is_timed_as_patched(models, tmp_path, capsys):
    """GPT-2's table holds 64 positions; `sinusoidal` takes 128. The estimate timed the model as loaded at 128
    tokens: an IndexError before the first measure."""
    results = recipe.main(argv(models, "gpt2", tmp_path, "--eval.variants", "sinusoidal", "--eval.perplexity_lengths",
                               "128", "--eval.perplexity_documents", "1"))
    assert results["variants"]["sinusoidal"]["lengths"]["lengths"] == [128]
    assert re.search(r"^to do: 1 evaluation\(s\) x 1 forward passes of up to 128 tokens; .*timed passes of 128 and "
                     r"128 tokens\)$", capsys.readouterr().err, re.M)


@pytest.mark.parametrize("measure", [["--eval.recall_lengths", "60", "--eval.recall_passages", "2",
                                      "--eval.recall_passage_tokens", "8"],
                                     ["--eval.tasks", "passkey", "--eval.task_lengths", "400"],
                                     ["--eval.perplexity_lengths", "32"]], ids=["recall", "tasks", "perplexity"])
def test_an_encoder_is_refused_before_its_weights_load(models, tmp_path, capsys, monkeypatch, measure):
    no_loading(monkeypatch)
    said = refusal(capsys, argv(models, "bert", tmp_path / "out", "--eval.variants", "none", *measure))
    assert re.search(r"model '.*bert' is a BertModel \(bert\), not a causal LM; the evaluate recipe scores each "
                     r"next token", said), said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value, says", [
    ("task_lengths", "10000000", r"eval\.task_lengths 10000000 is past 8192 tokens, the most a length may be: 32 x "
                                 r"the longest context in play \(256: the model's own 64 and "
                                 r"eval\.max_position_embeddings \[256\]\)"),
    ("recall_lengths", "10000000", r"eval\.recall_lengths 10000000"),   # (recall's own layout bound may say it first)
    ("curve_length", "10000000", r"eval\.curve_length 10000000 is past 8192 tokens"),
    ("task_lengths", "3000000000", r"eval\.task_lengths must hold token counts <= 2147483647 .*got \[3000000000\]"),
])
def test_a_length_far_past_every_context_is_refused_before_loading(models, tmp_path, capsys, monkeypatch, field,
                                                                   value, says):
    no_loading(monkeypatch)
    extra = ["--eval.tasks", "passkey"] if field == "task_lengths" else []
    said = refusal(capsys, argv(models, "llama", tmp_path / "out", "--eval.variants", "none", f"--eval.{field}", value,
                                *extra))
    assert re.search(says, said), said


def test_a_length_past_a_table_is_refused_before_the_inputs_are_built(models, tmp_path, capsys, monkeypatch):
    """GPT-2's 64 positions against RULER samples of 400 tokens: refused before make_samples builds them."""
    monkeypatch.setattr(ruler, "make_samples", lambda *a, **k: pytest.fail("samples built"))
    said = refusal(capsys, argv(models, "gpt2", tmp_path / "out", "--eval.variants", "none", "--eval.tasks", "passkey",
                                "--eval.task_lengths", "400"))
    assert "variant 'none' cannot take the 400 tokens" in said


PERPLEXITY = ["--eval.variants", "none", "--eval.perplexity_lengths", "32", "--eval.perplexity_documents", "1"]


def test_a_resume_with_other_settings_names_each_and_both_values(models, tmp_path, capsys, monkeypatch):
    recipe.main(argv(models, "llama", tmp_path, *PERPLEXITY))
    before = (tmp_path / "results.json").read_text()
    said = refusal(capsys, argv(models, "llama", tmp_path, *PERPLEXITY[:-1], "2", "--eval.curve_length", "64",
                                "--model.attn_implementation", "eager"))
    assert ("already holds another configuration: model.attn_implementation \"sdpa\" -> \"eager\", "
            "eval.perplexity_documents 1 -> 2, eval.curve_length 0 -> 64 (saved -> this command)") in said, said
    assert (tmp_path / "results.json").read_text() == before
    # settings no asked measure reads change nothing: the run resumes, nothing measured again
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("measured again"))
    for unread in (["--eval.task_needles", "6", "--eval.task_hops", "2"], ["--eval.curve_bucket", "16"],
                   ["--eval.recall_passages", "3", "--eval.trials", "4", "--eval.depths", "0.2"]):
        assert set(recipe.main(argv(models, "llama", tmp_path, *PERPLEXITY, *unread))["variants"]) == {"none"}


def test_a_resume_ignores_task_needles_without_a_needle_family_and_names_them_with_one(models, tmp_path, capsys,
                                                                                        monkeypatch):
    tasks = ["--eval.variants", "none", "--eval.tasks", "vt", "--eval.task_lengths", "600", "--eval.task_samples", "1"]
    recipe.main(argv(models, "llama", tmp_path, *tasks))
    said = refusal(capsys, argv(models, "llama", tmp_path, *tasks, "--eval.task_hops", "2"))   # vt reads its hops
    assert "eval.task_hops 4 -> 2" in said
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("measured again"))
    recipe.main(argv(models, "llama", tmp_path, *tasks, "--eval.task_needles", "6"))   # no needle family: unread
    assert recipe.unread({**recipe.dataclasses.asdict(evaluate_config.EvalArgs()), "tasks": ["multikey"]}) >= {"task_hops"}
    assert "task_needles" not in recipe.unread({**recipe.dataclasses.asdict(evaluate_config.EvalArgs()), "tasks": ["multikey"]})



def no_nan(text: str):
    """json.loads that refuses NaN and Infinity (strict JSON)."""
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_results_json_is_strict_json_with_a_note_and_a_rerun_reads_the_nan_back(models, tmp_path, capsys, monkeypatch):
    args = argv(models, "nan", tmp_path, *PERPLEXITY, "--eval.curve_length", "64", "--eval.curve_bucket", "16")
    results = recipe.main(args)
    assert math.isnan(results["variants"]["none"]["lengths"]["perplexity"][0])   # in memory: as measured
    saved = no_nan((tmp_path / "results.json").read_text())
    assert saved["variants"]["none"]["lengths"]["perplexity"] == [None]
    assert saved["not_finite"]["note"].startswith("JSON has no NaN or infinity: these values are written as null")
    assert [["variants", "none", "lengths", "perplexity", 0], "nan"] in saved["not_finite"]["values"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| none | - | one pass |" in summary
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("measured again"))
    again = recipe.main(args)   # resumed: the NaN read back, the summary the same
    assert math.isnan(again["variants"]["none"]["lengths"]["perplexity"][0])
    assert (tmp_path / "summary.md").read_text() == summary
    assert no_nan((tmp_path / "results.json").read_text())["not_finite"] == saved["not_finite"]


def test_strict_json_lists_each_value_and_an_edited_list_is_refused(tmp_path):
    text = recipe.strict_json({"a": {"b": [1.0, float("inf")], "c": float("-inf")}, "d": math.nan})
    saved = no_nan(text)
    assert saved["a"] == {"b": [1.0, None], "c": None} and saved["d"] is None
    assert saved["not_finite"]["values"] == [[["a", "b", 1], "inf"], [["a", "c"], "-inf"], [["d"], "nan"]]
    back = recipe.restore_not_finite(saved, tmp_path / "results.json")
    assert back["a"]["b"][1] == math.inf and back["a"]["c"] == -math.inf and math.isnan(back["d"])
    assert "not_finite" not in back
    with pytest.raises(recipe.ConfigError, match="names .*'x'.*which holds no null there"):
        recipe.restore_not_finite({"not_finite": {"values": [[["x"], "nan"]]}}, tmp_path / "results.json")
    assert "not_finite" not in no_nan(recipe.strict_json({"a": 1.5}))


def test_the_to_do_line_of_a_resumed_run_counts_what_is_left(models, tmp_path, capsys, monkeypatch):
    """Two RULER cells (400 and 500 tokens); the run stopped after the first: the rerun has one pass left."""
    args = argv(models, "llama", tmp_path, "--eval.variants", "none", "--eval.tasks", "passkey", "--eval.task_lengths",
                "400", "500", "--eval.task_samples", "1")
    real, calls = ruler.score_samples, []

    def second_interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(ruler, "score_samples", second_interrupted)
    with pytest.raises(SystemExit):
        recipe.main(args)
    assert re.search(r"^to do: 1 evaluation\(s\) x 2 forward passes of up to 500 tokens; ", capsys.readouterr().err,
                     re.M)
    monkeypatch.setattr(ruler, "score_samples", real)
    recipe.main(args)
    err = capsys.readouterr().err
    assert re.search(r"^to do: 1 evaluation\(s\) x 1 forward passes of up to 500 tokens; .*; done already "
                     r"\(results\.json\): 1 recall / task cell\(s\)$", err, re.M), err
    capsys.readouterr()
    recipe.main(args)   # everything saved: nothing left, nothing timed
    assert re.search(r"^to do: nothing left; done already \(results\.json\): 1 evaluation\(s\)$",
                     capsys.readouterr().err, re.M)


# -- the local evaluate metric modules: an unknown name in one line ------------------------------------------------

CALL_CASES = [
    CallCase("metrics-unknown", lambda: hf_posenc.metrics.path("x"), hp.InvalidParameterError,
             "no local metric 'x'; available: perplexity"),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[c.id for c in CALL_CASES])
def test_bad_input_to_the_python_api_is_refused_in_one_line(case):
    refused_in_one_line(case)
