"""lm-evaluation-harness on patched models: the offline long-context tasks, scored as hf_posenc scores them; bad
arguments to the entry point (HFPosencLM, write_tasks, the command line) refused in one line, before any weights
load, and the docs saying how lm-eval reaches the model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import hf_posenc as hp  # noqa: E402
from hf_posenc import eval as hpe  # noqa: E402
from hf_posenc.eval import harness  # noqa: E402
from hf_posenc import loading
from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer  # noqa: E402

ORIGINAL = 256
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Tokenizer folders saved for RULER go to a cache of the test's own."""
    monkeypatch.setattr(loading, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path / "cache"))


def patched_model(method="yarn", **params):
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL)
    return hp.patch(model, method, factor=2, **params)


def by_length(samples):
    return sorted(samples, key=lambda s: (s["doc"]["depth"], s["doc_id"]))


def test_lm_eval_scores_the_offline_passkey_as_hf_posenc_does(tmp_path):
    tokenizer, model = tiny_tokenizer(), patched_model()
    lengths, depths = [300, 500], [0.25, 0.75]
    names = harness.write_tasks(tmp_path, tokenizer, lengths=lengths, depths=depths, trials=2)
    assert names == ["hf_posenc_passkey_300", "hf_posenc_passkey_500"]

    lm = harness.HFPosencLM(model, tokenizer)
    assert lm.max_length == 2 * ORIGINAL  # the patched context, not the config's original one
    out = harness.evaluate(lm, tmp_path, log_samples=True)

    for length, name in zip(lengths, names):
        trials = hpe.make_trials("passkey", tokenizer, lengths=[length], depths=depths, trials=2)
        ours = hpe.score_trials(model, trials, progress=False)
        theirs = sorted(out["samples"][name], key=lambda s: s["doc_id"])
        assert len(theirs) == len(ours) == 4
        for trial, mine, sample in zip(trials, ours, theirs):
            assert sample["doc"]["context"] == tokenizer.decode(trial.prompt)
            logprob, greedy = sample["resps"][0][0]
            assert logprob == pytest.approx(mine["logprob"], abs=1e-3)
            assert greedy == mine["correct"]
        accuracy = sum(s["correct"] for s in ours) / len(ours)
        assert out["results"][name]["acc,none"] == pytest.approx(accuracy)
    assert out["results"][harness.GROUP]["sample_len"] == 8


def test_plain_hflm_truncates_where_the_patched_context_does_not(tmp_path):
    """lm-eval sized from the original context left-truncates a 500-token trial: another log-prob."""
    from lm_eval.models.huggingface import HFLM

    tokenizer, model = tiny_tokenizer(), patched_model()
    harness.write_tasks(tmp_path, tokenizer, lengths=[500], depths=[0.5], trials=1)
    ours = harness.evaluate(harness.HFPosencLM(model, tokenizer), tmp_path, log_samples=True)
    short = harness.evaluate(HFLM(pretrained=model, tokenizer=tokenizer, max_length=ORIGINAL, device="cpu"),
                             tmp_path, log_samples=True)
    [a], [b] = ours["samples"]["hf_posenc_passkey_500"], short["samples"]["hf_posenc_passkey_500"]
    assert a["resps"][0][0][0] != pytest.approx(b["resps"][0][0][0], abs=1e-3)


@pytest.mark.parametrize("method", ["dynamic", "alibi"])
def test_a_checkpoint_stock_transformers_cannot_express_loads_patched(tmp_path, method):
    tokenizer, model = tiny_tokenizer(), patched_model(method) if method == "dynamic" else hp.patch(
        tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL), method)
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    lm = harness.HFPosencLM(str(tmp_path / "ckpt"), dtype="float32")
    assert hp.describe(lm.model)["method"] == method
    assert lm.max_length == hp.describe(model)["max_position_embeddings"]
    ids = torch.arange(40)[None] % TINY_TEXT_VOCAB
    torch.testing.assert_close(lm.model(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_patch_argument_and_bad_input(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL)
    model.save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    lm = harness.HFPosencLM(str(tmp_path / "plain"), patch="ntk factor=4")
    assert hp.describe(lm.model)["method"] == "ntk" and lm.max_length == 4 * ORIGINAL
    with pytest.raises(hp.UnknownMethodError, match="yrn"):
        harness.HFPosencLM(str(tmp_path / "plain"), patch="yrn factor=4")
    with pytest.raises(TypeError, match="tokenizer"):
        harness.HFPosencLM(model)
    with pytest.raises(ValueError, match="kinds"):
        harness.write_tasks(tmp_path / "t", tokenizer, lengths=[100], kinds=["keypass"])
    with pytest.raises(ValueError, match="lengths"):
        harness.write_tasks(tmp_path / "t", tokenizer, lengths=[0])
    with pytest.raises(ValueError, match="too short"):
        harness.write_tasks(tmp_path / "t", tokenizer, lengths=[20])
    assert not (tmp_path / "t").exists()  # refused before anything was written


def test_lm_eval_command_line_with_the_registered_model(tmp_path):
    tokenizer, model = tiny_tokenizer(), patched_model("dynamic")
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    harness.write_tasks(tmp_path / "tasks", tokenizer, lengths=[300], depths=[0.5], trials=1)
    proc = subprocess.run(
        [sys.executable, "-m", "hf_posenc.eval.harness", "--model", "hf_posenc", "--model_args",
         f"pretrained={tmp_path / 'ckpt'},dtype=float32", "--include_path", str(tmp_path / "tasks"),
         "--tasks", harness.GROUP, "--device", "cpu", "--output_path", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list((tmp_path / "cache" / "tokenizers").iterdir())  # the tokenizer folder RULER's tasks would read
    [result] = list((tmp_path / "out").rglob("results*.json"))
    assert "hf_posenc_passkey_300" in json.loads(result.read_text())["results"]
    missing = subprocess.run([sys.executable, "-m", "hf_posenc.eval.harness", "--model", "hf_posenc", "--model_args",
                              f"pretrained={tmp_path / 'nothing'}", "--tasks", harness.GROUP, "--include_path",
                              str(tmp_path / "tasks")], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith("error: no model at ")


@pytest.fixture
def checkpoint(tmp_path):
    tokenizer, model = tiny_tokenizer(), tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL)
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_unknown_model_arguments_are_refused_before_any_weights_load(checkpoint, monkeypatch):
    monkeypatch.setattr(harness.api, "from_pretrained", lambda *a, **k: pytest.fail("the weights were loaded"))
    allowed = "the model takes: pretrained, tokenizer, patch, max_length, dtype, attn_implementation, device, batch_size"
    with pytest.raises(hp.InvalidParameterError, match=re.escape("unknown hf_posenc model argument bogus=1; " + allowed)):
        harness.HFPosencLM(str(checkpoint), bogus=1)
    with pytest.raises(hp.InvalidParameterError, match=r"argument dtyp='bfloat16' \(did you mean dtype\?\)"):
        harness.HFPosencLM(str(checkpoint), dtyp="bfloat16")
    # HFLM's loading arguments do nothing to a model already loaded: refused, not dropped
    with pytest.raises(hp.InvalidParameterError, match=r"arguments revision='v2', peft='adapter/'"):
        harness.HFPosencLM(str(checkpoint), revision="v2", peft="adapter/")


def test_unknown_model_arguments_end_the_command_line_with_one_error_line(checkpoint, capsys, monkeypatch):
    # lm-eval's log handler, made once a process, would keep writing to this test's captured (then closed) stderr
    monkeypatch.setattr("lm_eval.utils._LOGGING_CONFIGURED", True)
    code = harness.main(["--model", "hf_posenc", "--model_args", f"pretrained={checkpoint},dtyp=float32,bogus=1",
                         "--tasks", harness.GROUP])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "Traceback" not in "\n".join(lines)
    assert lines[-1].startswith("error: unknown hf_posenc model arguments dtyp='float32', bogus=1 (did you mean dtype?);")
    assert lines[-1].endswith(", ".join(harness.MODEL_ARGS))


def test_the_model_goes_to_the_device_lm_eval_names(checkpoint):
    if torch.cuda.is_available():
        assert harness.HFPosencLM(str(checkpoint), device="cuda").model.device.type == "cuda"
    else:  # lm_eval's default, cuda:0, on a machine without CUDA: the CPU, as lm-eval's HFLM does, and a warning
        with pytest.warns(UserWarning, match="no CUDA device, the model runs on the CPU"):
            assert harness.HFPosencLM(str(checkpoint), device="cuda:0").model.device.type == "cpu"
    with pytest.raises(hp.InvalidParameterError, match="device 'gpu0'|device must be a torch device"):
        harness.HFPosencLM(str(checkpoint), device="gpu0")
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL)
    with pytest.raises(hp.InvalidParameterError, match="the model given is on cpu; move it first"):
        harness.HFPosencLM(model, tiny_tokenizer(), device="meta")


def test_lm_eval_reaches_the_model_by_its_plug_in_entry_point(tmp_path):
    """pyproject declares the model in lm-eval's plug-in group; an lm-eval that reads the group (its docs/plugins.md)
    runs the bare `lm_eval --model hf_posenc`, 0.4.13 and older do not know the name, as the docs say."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["lm_eval.models"]
    module, _, name = declared["hf_posenc"].partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is harness.HFPosencLM

    import lm_eval.api.registry as registry

    # what `lm_eval --model hf_posenc` does first, in a fresh process that never imported hf_posenc
    lookup = subprocess.run([sys.executable, "-c", "from lm_eval.api.registry import get_model; "
                             "print(get_model('hf_posenc').__module__)"], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)  # not the checkout, whose build folders may hold older metadata
    docs = (ROOT / "docs" / "evaluate.md").read_text()
    if hasattr(registry, "import_plugins"):  # lm-eval with plug-ins
        assert lookup.returncode == 0 and lookup.stdout.split()[-1] == "hf_posenc.eval.harness", lookup.stderr[-1000:]
    else:
        assert lookup.returncode != 0 and "no model for this name found" in lookup.stderr
        assert "python -m hf_posenc.eval.harness --model hf_posenc" in docs
        assert re.search(r"bare `lm_eval --model hf_posenc` does not know the name in lm-eval 0\.4\.13", docs)
    assert '[project.entry-points."lm_eval.models"]' in docs


def word_tokenizer():
    """A word-level tokenizer (RULER's variable tracking needs its few-shot example in 500 tokens: bytes are too
    many), any text, no hub: ids 0-259, like tiny_tokenizer()."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "VAR", "=", ".", ":", ",", "?", "the", "is", "of", "variables", "are", "assigned",
             "value", "Answer", "According", "to", "chain", "(", ")", "s", "assignment", "Memorize", "and", "track"]
    words += [str(i) for i in range(100)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")


# RULER's variable tracking as lm-eval's ruler/vt.yaml sets it up, without its `include` of niah_single_1.yaml, whose
# import (wonderwords' 6 million word pairs) costs 10-40 s
RULER_VT = """task: ruler_vt_alone
dataset_path: ""
output_type: generate_until
test_split: test
custom_dataset: !function lm_eval.tasks.ruler.vt_utils.get_vt_dataset
doc_to_text: "{{input}}"
doc_to_target: "{{outputs}}"
gen_prefix: "{{gen_prefix}}"
target_delimiter: " "
process_results: !function lm_eval.tasks.ruler.common_utils.process_results
metric_list:
  - metric: "1024"
    aggregation: !function lm_eval.tasks.ruler.common_utils.aggregate_metrics
    higher_is_better: true
generation_kwargs: {do_sample: false, temperature: 0.0, max_gen_toks: 30, until: []}
metadata: {version: 1.0}
"""


def test_rulers_offline_task_runs_on_the_models_own_tokenizer(tmp_path, monkeypatch):
    """RULER builds its samples with `AutoTokenizer.from_pretrained(metadata["tokenizer"] or "pretrained")`: it
    gets a local folder holding the model's tokenizer, never a name for the hub."""
    from transformers import AutoTokenizer

    loaded = []
    original = AutoTokenizer.from_pretrained.__func__
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        classmethod(lambda cls, name, *a, **k: loaded.append(name) or original(cls, name, *a, **k)))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "vt.yaml").write_text(RULER_VT)
    tokenizer = word_tokenizer()
    lm = harness.HFPosencLM(tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=2048), tokenizer)
    out = harness.evaluate(lm, tmp_path / "tasks", ["ruler_vt_alone"], metadata={"max_seq_lengths": [1024]}, limit=2,
                           log_samples=True)

    [folder] = set(loaded)
    assert Path(folder).parent == tmp_path / "cache" / "tokenizers"
    text = "VAR A = 12 . VAR B = VAR A"
    assert AutoTokenizer.from_pretrained(folder)(text).input_ids == tokenizer(text).input_ids
    samples = out["samples"]["ruler_vt_alone"]
    assert len(samples) == 2 and all(s["doc"]["max_length"] == 1024 for s in samples)
    assert 0 <= out["results"]["ruler_vt_alone"]["1024,none"] <= 1


def test_the_command_line_gives_ruler_the_models_tokenizer(checkpoint, tmp_path, monkeypatch):
    from lm_eval._cli import HarnessCLI

    def prepared(*argv):
        monkeypatch.setattr(sys, "argv", ["lm_eval", *argv])
        args = HarnessCLI().parse_args()
        harness._prepare_run(args)
        return args

    args = prepared("--model", "hf_posenc", "--model_args", f"pretrained={checkpoint},dtype=float32",
                    "--tasks", "ruler_vt", "--metadata", '{"max_seq_lengths": [256]}')
    folder = args.metadata.pop("tokenizer")
    assert args.metadata == {"max_seq_lengths": [256]} and Path(folder).parent == tmp_path / "cache" / "tokenizers"
    assert loading.load_tokenizer(folder)("One two").input_ids == tiny_tokenizer()("One two").input_ids
    given = prepared("--model", "hf_posenc", "--model_args", f"pretrained={checkpoint}", "--tasks", "ruler_vt",
                     "--metadata", '{"tokenizer": "mine"}')
    assert given.metadata == {"tokenizer": "mine"}  # named by the user: kept
    other = prepared("--model", "hf", "--model_args", f"pretrained={checkpoint},bogus=1", "--tasks", "ruler_vt")
    assert other.metadata is None  # another model: lm-eval's business
    (tmp_path / "cfg.yaml").write_text(f"model: hf_posenc\nmodel_args: pretrained={checkpoint}\n"
                                       "metadata: {max_seq_lengths: [128]}\ntasks: ruler_vt\n")
    from_config = prepared("--config", str(tmp_path / "cfg.yaml"))
    assert from_config.metadata == {"max_seq_lengths": [128], "tokenizer": folder}


BAD_LENGTHS = [('{"max_seq_lengths": [0]}', "[0]"), ("max_seq_lengths=abc", "'abc'"), ('{"max_seq_lengths": []}', "[]"),
               ('{"max_seq_lengths": [-5]}', "[-5]"), ("max_seq_lengths=4096", "4096"),
               ('{"max_seq_lengths": [true]}', "[True]")]


@pytest.mark.parametrize("metadata, shown", BAD_LENGTHS)
def test_rulers_lengths_are_refused_in_one_line_before_any_work(checkpoint, capsys, monkeypatch, metadata, shown):
    """RULER iterates max_seq_lengths as given: 0 or a negative length ended in RULER's ValueError once the tasks were
    built, a string in a TypeError, [] in an IndexError."""
    monkeypatch.setattr("lm_eval.utils._LOGGING_CONFIGURED", True)
    monkeypatch.setattr(harness.api, "from_pretrained", lambda *a, **k: pytest.fail("the weights were loaded"))
    code = harness.main(["run", "--model", "hf_posenc", "--model_args", f"pretrained={checkpoint}", "--tasks",
                         "niah_single_1", "--metadata", metadata])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "Traceback" not in "\n".join(lines) and len(lines) == 1, lines
    assert lines[0] == (f"error: metadata max_seq_lengths must be a non-empty list of token counts >= 1, e.g. [4096, "
                        f"8192] (on lm_eval's command line --metadata '{{\"max_seq_lengths\": [4096]}}'), got {shown}")


def test_rulers_lengths_past_the_models_context_are_refused_before_the_weights_load(checkpoint, capsys, monkeypatch):
    """lm-eval cuts a prompt longer than max_length from the left without a word: a length past the (patched)
    context is refused, from the config alone."""
    monkeypatch.setattr("lm_eval.utils._LOGGING_CONFIGURED", True)
    monkeypatch.setattr(harness.api, "from_pretrained", lambda *a, **k: pytest.fail("the weights were loaded"))
    for model_args, context in ((f"pretrained={checkpoint}", ORIGINAL), (f"pretrained={checkpoint},patch=yarn factor=4",
                                                                         4 * ORIGINAL),
                                (f"pretrained={checkpoint},max_length=300", 300)):
        code = harness.main(["run", "--model", "hf_posenc", "--model_args", model_args, "--tasks", "niah_single_1",
                             "--metadata", f'{{"max_seq_lengths": [64, {context + 1}]}}'])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"error: metadata max_seq_lengths [64, {context + 1}]: {context + 1} is past the "
                                   f"model's context of {context} tokens (its max_length; lm-eval would cut"), lines


def test_evaluate_refuses_rulers_lengths_before_building_a_task(monkeypatch):
    import lm_eval.tasks

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda *a, **k: pytest.fail("tasks indexed"))
    lm = harness.HFPosencLM(tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL), tiny_tokenizer())
    with pytest.raises(hp.InvalidParameterError, match=r"max_seq_lengths must be a non-empty list .*got \(\)"):
        harness.evaluate(lm, tasks=["niah_single_1"], metadata={"max_seq_lengths": ()})
    with pytest.raises(hp.InvalidParameterError, match=rf"{ORIGINAL * 2} is past the model's context of {ORIGINAL}"):
        harness.evaluate(lm, tasks=["niah_single_1"], metadata={"max_seq_lengths": [ORIGINAL * 2]})


# -- bad arguments to the lm-eval entry point, and the docs on how lm-eval reaches the model ----------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tiny import TINY_TEXT_VOCAB, tiny_tokenizer

    root = tmp_path_factory.mktemp("harness")
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=256)
    model.save_pretrained(root / "bare")  # what README's quick start writes: no tokenizer
    model.save_pretrained(root / "full")
    tiny_tokenizer().save_pretrained(root / "full")
    return root


HARNESS_CASES = [
    ("max-length-abc", {"pretrained": "{root}/full", "max_length": "abc"}, hp.InvalidParameterError,
     r"max_length must be a token count >= 1 .*got 'abc'"),
    ("max-length-negative", {"pretrained": "{root}/full", "max_length": -5}, hp.InvalidParameterError,
     r"max_length must be a token count >= 1 .*got -5"),
    ("max-length-zero", {"pretrained": "{root}/full", "max_length": 0}, hp.InvalidParameterError, r"got 0"),
    ("max-length-fraction", {"pretrained": "{root}/full", "max_length": 12.5}, hp.InvalidParameterError, r"got 12.5"),
    ("max-length-bool", {"pretrained": "{root}/full", "max_length": True}, hp.InvalidParameterError, r"got True"),
    ("no-pretrained", {"patch": "yarn factor=4"}, hp.InvalidParameterError,
     r"HFPosencLM needs pretrained=: .*--model_args pretrained=FOLDER"),
    ("folder-without-tokenizer", {"pretrained": "{root}/bare"}, hp.InvalidInputError,
     r"bare has no tokenizer transformers can load .*tokenizer\.save_pretrained\(folder\).*tokenizer=NAME_OR_FOLDER"),
]


@pytest.mark.parametrize("kwargs,error,pattern", [c[1:] for c in HARNESS_CASES], ids=[c[0] for c in HARNESS_CASES])
def test_the_lm_eval_model_refuses_bad_arguments(kwargs, error, pattern, checkpoints, monkeypatch):
    harness = pytest.importorskip("hf_posenc.eval.harness")
    monkeypatch.setattr(harness.api, "from_pretrained",
                        lambda *a, **k: pytest.fail("the weights were loaded"))
    kwargs = {k: v.format(root=checkpoints) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(error, match=pattern):
        harness.HFPosencLM(**kwargs)


def test_the_lm_eval_model_takes_max_length_as_lm_eval_gives_it(checkpoints):
    harness = pytest.importorskip("hf_posenc.eval.harness")
    for given in ("300", 300, 300.0):
        assert harness.HFPosencLM(str(checkpoints / "full"), max_length=given).max_length == 300
    lm = harness.HFPosencLM(str(checkpoints / "bare"), tokenizer=str(checkpoints / "full"))
    assert lm.max_length == 256


WRITE_TASKS_CASES = [
    ("lengths-a-string", {"lengths": "400"}, r"lengths must be a list \(e\.g\. \[4096, 16384\]\), got '400'"),
    ("lengths-an-int", {"lengths": 400}, r"lengths must be a list .*got 400"),
    ("kinds-a-string", {"lengths": [400], "kinds": "passkey"}, r"kinds must be a list .*got 'passkey'"),
    ("depths-a-number", {"lengths": [400], "depths": 0.5}, r"depths must be a list .*got 0.5"),
]


@pytest.mark.parametrize("kwargs,pattern", [c[1:] for c in WRITE_TASKS_CASES], ids=[c[0] for c in WRITE_TASKS_CASES])
def test_write_tasks_refuses_a_scalar_for_a_list(kwargs, pattern, tmp_path):
    harness = pytest.importorskip("hf_posenc.eval.harness")
    from tiny import tiny_tokenizer

    with pytest.raises(hp.ParameterTypeError, match=pattern):
        harness.write_tasks(tmp_path / "t", tiny_tokenizer(), **kwargs)
    assert not (tmp_path / "t").exists()


def test_lm_eval_command_line_refusals_are_one_line(checkpoints, tmp_path, capsys, monkeypatch):
    harness = pytest.importorskip("hf_posenc.eval.harness")
    from tiny import tiny_tokenizer

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    harness.write_tasks(tmp_path / "tasks", tiny_tokenizer(), lengths=[300], depths=[0.5], trials=1)
    capsys.readouterr()
    code = harness.main(["--model", "hf_posenc", "--model_args", f"pretrained={checkpoints / 'full'},patch=yarn "
                         "factor=4,max_length=abc", "--include_path", str(tmp_path / "tasks"), "--tasks", harness.GROUP])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines[-1].startswith("error: max_length must be a token count >= 1"), lines
    assert "Traceback" not in "\n".join(lines)


def test_docs_say_how_lm_eval_reaches_the_model():
    """`lm_eval --model hf_posenc` alone does not know the name (lm-eval has no model plug-ins): the docs say the
    model is registered by importing hf_posenc.eval.harness, i.e. `python -m hf_posenc.eval.harness`, and never
    suggest the bare command."""
    harness = pytest.importorskip("hf_posenc.eval.harness")
    from lm_eval.api.registry import get_model

    assert get_model("hf_posenc") is harness.HFPosencLM  # registered by the import
    text = (ROOT / "docs" / "serving.md").read_text()
    assert "python -m hf_posenc.eval.harness --model hf_posenc" in text
    assert re.search(r"bare `lm_eval --model hf_posenc` does not know", text)
    assert not re.search(r"^\s*lm_eval --model hf_posenc", text, re.M)
