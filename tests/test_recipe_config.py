"""The recipes' one config system (hf_posenc/recipes/recipe_config.py), on a small schema of its own and on both
recipes: a YAML file of nested sections, dotted flags over it, --help, unknown keys, wrong types."""

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
import yaml

from hf_posenc.errors import ConfigError
from hf_posenc.recipes import CONFIGS
from hf_posenc.recipes import recipe_config as rc
from hf_posenc.recipes import evaluate, finetune_config
from hf_posenc.recipes import evaluate_config

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Inner:
    n: int = field(default=3, metadata={"help": "a count"})
    rate: float = field(default=0.5, metadata={"help": "a rate"})
    name: str = field(default="x", metadata={"help": "a name"})
    maybe: Optional[str] = field(default=None, metadata={"help": "text or null"})
    sizes: list[int] = field(default_factory=lambda: [1], metadata={"help": "token counts"})
    words: list[str] = field(default_factory=list, metadata={"help": "variant specs"})
    switch: bool = field(default=False, metadata={"help": "on or off"})
    extra: Optional[dict] = field(default=None, metadata={"help": "a mapping"})
    limit: int | None = field(default=None, metadata={"help": "a bound or null"})   # PEP 604, as Optional[int]


@dataclass
class Toy:
    inner: Inner = field(default_factory=Inner, metadata={"help": "the section"})
    out: str = field(default="o", metadata={"help": "where it goes"})
    go: bool = field(default=False, metadata={"help": "a top-level switch"})


def parse(argv):
    return rc.parse(Toy, [str(a) for a in argv], usage="toy.py")


def test_dotted_flags_override_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inner:\n  n: 5\n  rate: 2e-5\n  sizes: [2, 3]\n  words: [a]\n  extra: {k: 0, j: 1}\nout: f\n")
    assert parse(["--config", path]) == Toy(Inner(n=5, rate=2e-5, sizes=[2, 3], words=["a"], extra={"k": 0, "j": 1}),
                                            out="f")
    # YAML reads 2e-5 as text: the field's type makes it the number
    assert isinstance(parse(["--config", path]).inner.rate, float)
    flags = ["--inner.n", "7", "--inner.words", "yarn beta_fast=16", "none", "--inner.sizes", "[8, 9]",
             "--inner.extra.k", "4", "--go", "--inner.rate=0.25"]
    expected = Toy(Inner(n=7, rate=0.25, sizes=[8, 9], words=["yarn beta_fast=16", "none"], extra={"k": 4, "j": 1}),
                   out="f", go=True)
    assert parse(["--config", path, *flags]) == expected
    assert parse([*flags, "--config", path]) == expected          # the flags win wherever they stand
    assert parse(["--inner.sizes", "4", "--inner.switch", "false"]) == Toy(Inner(sizes=[4], switch=False))


def test_a_string_flag_is_the_text_given():
    """YAML would read yes as true and none stays text in a list of specs; null is null where null is allowed."""
    cfg = parse(["--inner.name", "yes", "--inner.maybe", "null", "--inner.words", "none"])
    assert (cfg.inner.name, cfg.inner.maybe, cfg.inner.words) == ("yes", None, ["none"])
    assert parse(["--inner.maybe", "3"]).inner.maybe == "3"


def test_both_recipes_take_their_shipped_configs_with_flags_over_them(tmp_path):
    raw = yaml.safe_load((CONFIGS / "smollm2_pose_128k_finetune.yaml").read_text())
    cfg = finetune_config.parse_config(["--config", "smollm2_pose_128k_finetune", "--train.lr", "1e-4",
                                        "--posenc.max_position_embeddings", "65536", "--eval.lengths", "512", "1024"])
    expected = {**raw, "train": {**raw["train"], "lr": 1e-4}, "eval": {**raw["eval"], "lengths": [512, 1024]},
                "posenc": {**raw["posenc"], "max_position_embeddings": 65536}}
    got = cfg.to_dict()
    for section, values in expected.items():
        if isinstance(values, dict) and section != "posenc":
            assert {k: got[section][k] for k in values} == values, section
        else:
            assert got[section] == values, section

    raw = yaml.safe_load((CONFIGS / "eval_smollm2_cpu.yaml").read_text())
    args = evaluate_config.parse_args(["--config", "eval_smollm2_cpu", "--eval.curve_length", "4096",
                                "--eval.variants", "none", "yarn beta_fast=16", "--model.dtype", "float32"])
    expected = {**raw, "eval": {**raw["eval"], "curve_length": 4096, "variants": ["none", "yarn beta_fast=16"]},
                "model": {**raw["model"], "dtype": "float32"}}
    got = dataclasses.asdict(args)
    for section, values in expected.items():
        if isinstance(values, dict):
            assert {k: got[section][k] for k in values} == values, section
        else:
            assert got[section] == values, section
    assert got["data"]["split"] == "train"    # what the file leaves out keeps its default


def all_fields(schema, prefix=""):
    """(dotted name, Field) of every field of a config schema, sections unfolded."""
    for name, spec in rc.schema_fields(schema).items():
        if rc.is_section(spec.type):
            yield from all_fields(spec.type, f"{prefix}{name}.")
        else:
            yield prefix + name, spec


def check_help(text: str, schema) -> None:
    """Every field on a line of its own under its section's heading: `name: default`, its type, its doc."""
    lines = text.splitlines()
    for dotted, spec in all_fields(schema):
        *sections, name = dotted.split(".")
        assert spec.help, f"{dotted} has no doc"
        if sections:   # the lines under the section's heading
            heading = next(i for i, line in enumerate(lines) if line.startswith(f"  {sections[0]}:"))
            block = list(itertools.takewhile(lambda line: line.startswith("    "), lines[heading + 1:]))
        else:
            block = [line for line in lines if line.startswith("  ") and not line.startswith("   ")]
        indent = "    " if sections else "  "
        wanted = [line for line in block if line.startswith(f"{indent}{name}: {json.dumps(spec.default)} ")]
        assert len(wanted) == 1, (dotted, wanted)
        assert wanted[0].endswith(f"({rc.type_name(spec.type)}) {spec.help}"), wanted[0]


def test_help_lists_every_field_in_process(capsys):
    with pytest.raises(SystemExit) as done:
        parse(["--inner.n", "4", "-h"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    check_help(text, Toy)
    assert "    n: 3" in text and "(list of int) token counts" in text and "  go: false" in text


HELP_COMMANDS = {   # (hf-posenc finetune --help and -m hf_posenc.recipes.finetune --help: tests/test_cli.py)
    "recipes/finetune.py": ([sys.executable, str(ROOT / "recipes" / "finetune.py"), "--help"], finetune_config.FinetuneConfig),
    "recipes/evaluate.py -h": ([sys.executable, str(ROOT / "recipes" / "evaluate.py"), "-h"], evaluate_config.EvalConfig),
    # the console script's code path, without needing `hf-posenc` on PATH (an inactive venv)
    "hf-posenc evaluate": ([sys.executable, "-m", "hf_posenc.cli", "evaluate", "--help"], evaluate_config.EvalConfig),
    "-m evaluate": ([sys.executable, "-m", "hf_posenc.recipes.evaluate", "--help"], evaluate_config.EvalConfig),
}


def run(argv):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("name", HELP_COMMANDS)
def test_help_lists_every_field_with_its_default_and_doc_and_exits_0(name):
    argv, schema = HELP_COMMANDS[name]
    proc = run(argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: ") and "Traceback" not in proc.stderr
    check_help(proc.stdout, schema)


def test_unknown_keys_are_refused_naming_the_valid_ones(tmp_path):
    cases = [("inner:\n  count: 1\n", r"config file .*: section inner: unknown key\(s\) \['count'\]; the keys are: "
                                      r"n, rate, name, maybe, sizes, words, switch, extra, limit$"),
             ("outt: x\n", r"unknown key\(s\) \['outt'\]; the keys are: inner, out, go$"),
             ("inner: [1]\n", r"section inner must be a mapping of its keys \(n, rate, .*\), got \[1\]")]
    for text, message in cases:
        (tmp_path / "c.yaml").write_text(text)
        with pytest.raises(ConfigError, match=message):
            parse(["--config", tmp_path / "c.yaml"])
    with pytest.raises(ConfigError, match=r"unknown flag --inner.count: section inner has no key 'count'; the keys "
                                          r"are: n, rate, name, maybe, sizes, words, switch, extra, limit$"):
        parse(["--inner.count", "1"])
    with pytest.raises(ConfigError, match=r"unknown flag --model.name: the config has no key 'model'; the keys are: "
                                          r"inner, out, go$"):
        parse(["--model.name", "x"])
    with pytest.raises(ConfigError, match=r"^unknown flag --rate: .*; the keys are: inner, out, go "
                                          r"\(did you mean --inner\.rate\?\)$"):   # a field named without its section
        parse(["--rate", "3"])
    (tmp_path / "c.yaml").write_text("rate: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['rate'\]; .* \(did you mean inner\.rate\?\)$"):
        parse(["--config", tmp_path / "c.yaml"])
    with pytest.raises(ConfigError, match=r"--inner is a section; give one of its fields: --inner.n, --inner.rate"):
        parse(["--inner", "3"])
    with pytest.raises(ConfigError, match=r"unknown flag --inner.n.x: inner.n is an integer, not a mapping"):
        parse(["--inner.n.x", "3"])


def test_a_recipe_refuses_an_unknown_flag_in_one_line_with_exit_code_2(tmp_path):
    for recipe, flag, keys in (("evaluate.py", "--eval.curve_lenght", "variants, max_position_embeddings, grid"),
                               ("finetune.py", "--train.learning_rate", "objective, steps, batch_size")):
        proc = run([sys.executable, str(ROOT / "recipes" / recipe), flag, "5", "--output_dir", str(tmp_path / "o")])
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: unknown flag {flag}: "), proc.stderr
        assert keys in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_pep_604_optional_reads_as_typing_optional():
    """`int | None` is coerced and checked as Optional[int] is (it was passed through as the text given)."""
    assert parse(["--inner.limit", "7"]).inner.limit == 7
    assert parse(["--inner.limit", "null"]).inner.limit is None
    with pytest.raises(ConfigError, match=r"^--inner\.limit must be an integer or null, got 'abc' "
                                          r"\(a bound or null\)$"):
        parse(["--inner.limit", "abc"])


def test_a_type_error_names_the_field_the_value_and_the_type(tmp_path):
    path = tmp_path / "c.yaml"
    cases = [("inner:\n  n: abc\n", r"config file .*c\.yaml: inner\.n must be an integer, got 'abc' \(a count\)$"),
             ("inner:\n  n: 2.5\n", r"inner\.n must be an integer, got 2\.5"),
             ("inner:\n  n: true\n", r"inner\.n must be an integer, got True"),
             ("inner:\n  sizes: 5\n", r"inner\.sizes must be a list of integers \(YAML \[a, b, \.\.\.\], even for one\), "
                                      r"got 5 \(token counts\)$"),
             ("inner:\n  sizes: [1, x]\n", r"inner\.sizes must be a list of integers .*, got \[1, 'x'\]"),
             ("inner:\n  switch: maybe\n", r"inner\.switch must be true or false, got 'maybe' \(on or off\)$"),
             ("inner:\n  maybe: [1]\n", r"inner\.maybe must be a string or null, got \[1\]"),
             ("out: null\n", r"out must be a string, got None \(where it goes\)$")]
    for text, message in cases:
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            parse(["--config", path])
    with pytest.raises(ConfigError, match=r"^--inner\.rate must be a number, got 'fast' \(a rate\)$"):
        parse(["--inner.rate", "fast"])
    with pytest.raises(ConfigError, match=r"^--inner\.sizes must be a list of integers .*, got \[4, 'x'\]"):
        parse(["--inner.sizes", "4", "x"])
    with pytest.raises(ConfigError, match=r"^--inner\.extra\.k '\[1' is not a YAML value"):
        parse(["--inner.extra.k", "[1"])
    with pytest.raises(ConfigError, match=r"^--inner\.n needs a value$"):
        parse(["--inner.n"])
    with pytest.raises(ConfigError, match=r"^unexpected argument '4'"):
        parse(["--inner.n", "3", "4"])
