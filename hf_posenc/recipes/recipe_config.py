"""The one config system of the recipes (recipes/finetune.py, recipes/evaluate.py, recipes/search.py). In the
recipes, "config" means this alone: a recipe's run configuration, its YAML file and `--section.field` flags read
into the recipe's dataclass (FinetuneConfig, EvalConfig, SearchConfig), and what their sections share (the
`model` section, `ModelArgs`; the `data` section evaluate and search read, `DataArgs`; `need`, the one check of a
value).

A recipe declares its config as a dataclass whose fields are sections (dataclasses of their own) or plain
values, each with a default and a one-line doc: `field(default=..., metadata={"help": "..."})`. Then

- `--config FILE.yaml` (or a shipped config's name, `hf_posenc.recipes.config_path`) gives the sections as
  nested mappings;
- every field is also a flag `--section.field VALUE` that overrides the file (`--train.lr 1e-4`); a field
  that holds a mapping takes its keys the same way (`--posenc.factor 4`); a list field takes its items one
  by one (`--eval.variants none "yarn beta_fast=16"`) or as one YAML list (`[512, 1024]`); a true-or-false
  field alone means true (`--resume`);
- `--help` (or `-h`) prints every field with its default, its type and its doc, section by section;
- an unknown key (in the file or as a flag) is refused naming the valid ones, a value of the wrong type
  naming the field, the value and the type: a `ConfigError`, before anything loads. The dataclasses' own
  `__post_init__` then check the values (ranges, choices).

Fields typed `list`, `dict` or a union of several types are passed through as read: their section checks
them (a plain `list` of learning-rate betas, a `dict` of LoRA settings).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Union

import yaml

from ..errors import ConfigError
from . import config_path, shipped_configs

HELP = ("--help", "-h")
NONE = type(None)

# how an error names a type, and how --help does
WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
         dict: "a mapping"}
PLURALS = {int: "integers", float: "numbers", str: "strings", bool: "true or false values"}
NAMES = {dict: "mapping"}


def parse(schema: type, argv: list[str] | None = None, *, usage: str, about: str = "",
          shipped: Callable[[str], bool] = lambda name: True):
    """The config of `schema` from `argv` (default sys.argv[1:]): --config's file, then the flags over it.
    `shipped` picks the shipped configs a "not found" names; `usage` and `about` head --help."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(arg in HELP for arg in argv):
        print(help_text(schema, usage, about))
        raise SystemExit(0)
    file, flags = split_argv(argv, shipped)
    values = {} if file is None else from_file(schema, file, shipped)
    for key, texts in flags:
        set_flag(schema, values, key, texts)
    return build(schema, values)


# -- what every recipe's config shares -----------------------------------------------------------------------
# A field's metadata says whether a resumed fine-tune may change it (the other recipes do not resume).
FIXED = {"resume_may_change": False}
ADJUSTABLE = {"resume_may_change": True}
DTYPES = ("auto", "float32", "bfloat16", "float16")   # model.dtype


def need(ok: bool, message: str) -> None:
    """A config value's check: `message` as the one ConfigError when it fails."""
    if not ok:
        raise ConfigError(message)


@dataclasses.dataclass
class ModelArgs:
    """The model a recipe runs (the `model` section of every recipe; the fine-tune's extends it)."""

    name: str = dataclasses.field(default="smollm2", metadata={**FIXED,
        "help": "hub id, folder, .gguf file, or the aliases smollm2 / minilm"})
    dtype: str = dataclasses.field(default="auto", metadata={**FIXED,
        "help": "auto: bfloat16 where the hardware runs it natively, else float32 (the fine-tune keeps float32 "
                "weights there and trains in bfloat16 mixed precision); or bfloat16, float16, float32"})
    attn_implementation: str = dataclasses.field(default="auto", metadata={**ADJUSTABLE,
        "help": "auto: sdpa (the fine-tune: flash_attention_2 where installed on a GPU, else sdpa); or any "
                "transformers implementation: sdpa, eager, flash_attention_2, ..."})

    def __post_init__(self):
        need(isinstance(self.name, str) and bool(self.name.strip()),
             f"model.name must name a hub id, a folder or a .gguf file, got {self.name!r}")
        need(self.dtype in DTYPES, f"model.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        need(isinstance(self.attn_implementation, str) and bool(self.attn_implementation.strip()),
             "model.attn_implementation is empty")

    def attention(self, config=None) -> str:
        """The implementation to load with where the recipe does not choose its own for "auto": sdpa, or eager where
        the causal-LM class of `config` (when given) has no sdpa (Gemma 2)."""
        from ..train.hardware import choose_attention

        return choose_attention(self.attn_implementation, config, flash=False)


FRAMINGS = {"auto": "auto", "bos": True, "none": False}   # data.framing -> hf_posenc.corpora.bos_prefix's bos=


@dataclasses.dataclass
class DataArgs:
    """The text a recipe reads (the `data` section of every recipe; the fine-tune's extends it with how it packs
    training windows, hf_posenc/recipes/finetune_config.py)."""

    corpus: str = dataclasses.field(default="shakespeare", metadata={**FIXED,
        "help": "a load_corpus spec: shakespeare / kjv / stdlib, local .txt/.jsonl/.parquet files, a hub dataset "
                "NAME[:CONFIG] (hf_posenc/corpora.py)"})
    split: str = dataclasses.field(default="train", metadata={**FIXED, "help": "the split of a hub dataset"})
    text_column: str = dataclasses.field(default="text", metadata={**FIXED,
        "help": "the column that holds the text (.jsonl, .parquet, hub datasets)"})
    framing: str = dataclasses.field(default="auto", metadata={**FIXED,
        "help": "what starts each document, sequence and prompt: auto (as the tokenizer starts an input: BOS for "
                "Llama, Gemma, Mistral; nothing for GPT-2, SmolLM2), bos (the tokenizer's BOS token), none"})

    def __post_init__(self):
        need(isinstance(self.corpus, str) and bool(self.corpus.strip()),
             f"data.corpus must name a corpus (built-in, local files or a hub dataset), got {self.corpus!r}")
        for name in ("split", "text_column"):
            value = getattr(self, name)
            need(isinstance(value, str) and bool(value.strip()), f"data.{name} is empty")
        need(self.framing in FRAMINGS, f"data.framing must be one of {', '.join(FRAMINGS)}, got {self.framing!r}")

    def load(self):
        """The corpus as hf_posenc.corpora.load_corpus reads it, with this section's split and column."""
        from .. import corpora

        return corpora.load_corpus(self.corpus, split=self.split, text_column=self.text_column)


def program(script: str, prog: str | None = None) -> str:
    """The command as the user typed it, for `usage:`: `prog` when a front end gives it (`hf-posenc finetune`),
    else how this process started: `python -m hf_posenc.recipes.finetune` (also under accelerate launch -m),
    or the script's path as typed (`recipes/finetune.py`)."""
    if prog:
        return prog
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if started is not None and started.name == f"{script}.py":
        if started.resolve().parent == Path(__file__).resolve().parent:
            return f"python -m hf_posenc.recipes.{script}"
        return str(sys.argv[0])
    return f"recipes/{script}.py"


def split_argv(argv: list[str], shipped: Callable[[str], bool] = lambda name: True
               ) -> tuple[str | None, list[tuple[str, list[str]]]]:
    """(--config's value, [(flag, the values after it), ...]); `--key=value` is one value. A bare word that
    names one of this recipe's shipped configs (`shipped`) is refused with a hint to put --config before it."""
    file, flags, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise _unexpected(arg, shipped)
        key, eq, value = arg[2:].partition("=")
        end = i + 1
        while not eq and end < len(argv) and not argv[end].startswith("--"):
            end += 1
        texts, i = [value] if eq else argv[i + 1:end], end
        if key == "config":
            if not texts:
                raise ConfigError("--config needs a value: a YAML file or a shipped config's name")
            if len(texts) > 1:
                raise _unexpected(texts[1], shipped)
            file = texts[0]
        else:
            flags.append((key, texts))
    return file, flags


def _moved(schema: type, keys: list, dash: str) -> str:
    """Top-level keys that are fields of a section: ' (did you mean --eval.variants?)'."""
    found = [f"{dash}{name}.{key}" for key in keys for name, spec in schema_fields(schema).items()
             if is_section(spec.type) and key in schema_fields(spec.type)]
    return f" (did you mean {', '.join(found)}?)" if found else ""


def _unexpected(text: str, shipped: Callable[[str], bool] = lambda name: False) -> ConfigError:
    path = config_path(text)
    hint = f" (did you mean --config {text}?)" if path is not None and shipped(path.stem) else ""
    return ConfigError(f"unexpected argument {text!r}{hint}; use --config FILE and --section.field VALUE flags "
                       f"(--help lists them)")


# ------------------------------------------------------------------------------------------ the file
def read_file(value: str, shipped: Callable[[str], bool] = lambda name: True) -> dict:
    """The --config file (or a shipped config's name) as a mapping; a missing file, a folder or a YAML
    error is one clear line."""
    if Path(value).is_dir():
        raise ConfigError(f"--config {value!r} is a folder; give a YAML file (e.g. recipes/configs/*.yaml)")
    path = config_path(value)
    if path is None:
        raise ConfigError(f"config file not found: {value!r} (nor a shipped config: "
                          f"{', '.join(n for n in shipped_configs() if shipped(n))})")
    try:
        raw = yaml.safe_load(path.read_text())
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {value} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {value} is not valid YAML: {yaml_problem(err)}") from None
    if raw is None:   # not the defaults by surprise (the fine-tune recipe's: a 400-step SmolLM2 run)
        raise ConfigError(f"config file {value} is empty: give its sections (model:, data:, train:, ...; "
                          f"recipes/configs/ has examples), or leave --config out and give --section.field flags")
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {value} must be a mapping of keys (sections and fields: "
                          f"model: ..., output_dir: ...), got {raw!r}")
    return raw


def from_file(schema: type, file: str, shipped: Callable[[str], bool] = lambda name: True) -> dict:
    """The file's values, each key known and each value of its field's type (cast where YAML reads a
    number as text, e.g. 2e-5)."""
    return _typed(schema, read_file(file, shipped), f"config file {file}: ", "")


def _typed(schema: type, raw: dict, where: str, prefix: str) -> dict:
    fields = schema_fields(schema)
    unknown = sorted((k for k in raw if k not in fields), key=str)
    if unknown:
        section = f"section {prefix[:-1]}: " if prefix else ""
        raise ConfigError(f"{where}{section}unknown key(s) {unknown}; the keys are: {', '.join(fields)}"
                          + ("" if prefix else _moved(schema, unknown, "")))
    out = {}
    for key, value in raw.items():
        hint = fields[key].type
        if is_section(hint):
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"{where}section {prefix}{key} must be a mapping of its keys "
                                  f"({', '.join(schema_fields(hint))}), got {value!r}")
            out[key] = _typed(hint, value, where, f"{prefix}{key}.")
        else:
            out[key] = coerce(f"{where}{prefix}{key}", hint, value, fields[key].help)
    return out


def yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    return where + " ".join(problem.split()) + (" (YAML does not allow tabs for indentation)" if "\\t" in problem else "")


# ----------------------------------------------------------------------------------------- the flags
def set_flag(schema: type, values: dict, key: str, texts: list[str]) -> None:
    """`--section.field VALUE...` into `values` (nested like the file's), typed like a file's value."""
    parts = key.replace("-", "_").split(".")
    cls, holder = schema, values
    for i, part in enumerate(parts):
        fields = schema_fields(cls)
        if part not in fields:
            within = f"section {'.'.join(parts[:i])}" if i else "the config"
            raise ConfigError(f"unknown flag --{key}: {within} has no key {part!r}; the keys are: "
                              f"{', '.join(fields)}" + ("" if i else _moved(schema, [part], "--")))
        spec = fields[part]
        if is_section(spec.type):
            if i == len(parts) - 1:
                raise ConfigError(f"--{key} is a section; give one of its fields: "
                                  f"{', '.join(f'--{key}.{f}' for f in schema_fields(spec.type))}")
            cls, holder = spec.type, holder.setdefault(part, {})
            continue
        name, rest = ".".join(parts[:i + 1]), parts[i + 1:]
        if rest:   # a key inside a mapping field: --posenc.factor 4, --train.lora.r 8
            if not _admits(spec.type, dict):
                raise ConfigError(f"unknown flag --{key}: {name} is {words(spec.type)}, not a mapping")
            mapping = dict(holder.get(part) or {})
            inner = mapping
            for sub in rest[:-1]:
                inner[sub] = dict(inner.get(sub) or {}) if isinstance(inner.get(sub), dict) else {}
                inner = inner[sub]
            inner[rest[-1]] = _from_texts(f"--{key}", Any, texts)
            holder[part] = mapping
        else:
            holder[part] = coerce(f"--{name}", spec.type, _from_texts(f"--{name}", spec.type, texts), spec.help)
        return


def _from_texts(name: str, hint, texts: list[str]):
    """A flag's values as its field takes them: a string field's text as it is, a list field's items one
    by one, anything else read as YAML (numbers, true / false, null, [lists], {mappings})."""
    item = _list_item(hint)
    if len(texts) > 1:
        if item is None:
            raise _unexpected(texts[1])
        return [text if item is str else yaml_value(name, text) for text in texts]
    if not texts:
        if _admits(hint, bool):
            return True
        raise ConfigError(f"{name} needs a value")
    text = texts[0]
    if _only(hint, list) and not text.lstrip().startswith("["):
        return [text if item is str else yaml_value(name, text)]   # the one item of a list
    if _only(hint, str):
        return None if _admits(hint, NONE) and text in ("null", "~") else text
    return yaml_value(name, text)


def yaml_value(name: str, text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{name} {text!r} is not a YAML value: {yaml_problem(err)}") from None


# ----------------------------------------------------------------------------------------- the types
def coerce(name: str, hint, value, doc: str = ""):
    """`value` as the field's type (YAML reads 2e-5 as text and 1 where 1.0 is meant), or a ConfigError
    naming the field, the value and the type."""
    def refuse():
        return ConfigError(f"{name} must be {words(hint)}, got {value!r}" + (f" ({doc})" if doc else ""))

    members = _members(hint)
    if value is None:
        if NONE in members or hint is Any:
            return None
        raise refuse()
    members = [m for m in members if m is not NONE]
    if len(members) != 1 or members[0] in (Any, list, dict):
        return value   # several types, a plain list or mapping: the section checks it
    target = members[0]
    if typing.get_origin(target) is list:
        if not isinstance(value, list):
            raise refuse()
        try:
            return [coerce(name, typing.get_args(target)[0], v) for v in value]
        except ConfigError:
            raise refuse() from None
    try:
        if target is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "false", "yes", "no", "1", "0"):
                return str(value).lower() in ("true", "yes", "1")
            raise ValueError
        if target is int:
            if isinstance(value, (bool, list, dict)) or float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if target is float:
            if isinstance(value, (bool, list, dict)):
                raise ValueError
            return float(value)
        if target is str:
            if isinstance(value, (bool, list, dict)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError, OverflowError):
        raise refuse() from None
    return value


def _is_union(hint) -> bool:
    """Optional[int] and int | None alike (a config written with either spelling is read the same)."""
    return typing.get_origin(hint) in (Union, types.UnionType)


def _members(hint) -> list:
    return list(typing.get_args(hint)) if _is_union(hint) else [hint]


def _admits(hint, kind) -> bool:
    return any(m is kind or typing.get_origin(m) is kind for m in _members(hint))


def _only(hint, kind) -> bool:
    """The field holds `kind` (or null) and nothing else."""
    members = [m for m in _members(hint) if m is not NONE]
    return len(members) == 1 and (members[0] is kind or typing.get_origin(members[0]) is kind)


def _list_item(hint):
    """The item type of a list field (Any for a plain list), or None."""
    for m in _members(hint):
        if m is list:
            return Any
        if typing.get_origin(m) is list:
            return typing.get_args(m)[0]
    return None


def words(hint) -> str:
    """A type as an error says it: 'an integer', 'a list of strings (YAML [a, b, ...], even for one)'."""
    if hint is Any:
        return "any value"
    if _is_union(hint):
        return " or ".join("null" if m is NONE else words(m) for m in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return f"a list of {PLURALS.get(typing.get_args(hint)[0], 'values')} (YAML [a, b, ...], even for one)"
    return WORDS.get(hint, getattr(hint, "__name__", str(hint)))


def type_name(hint) -> str:
    """A type as --help shows it: int, list of int, str or null."""
    if hint is Any:
        return "any"
    if _is_union(hint):
        return " or ".join("null" if m is NONE else type_name(m) for m in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return f"list of {type_name(typing.get_args(hint)[0])}"
    return NAMES.get(hint, getattr(hint, "__name__", str(hint)))


# ---------------------------------------------------------------------------------------- the schema
@dataclasses.dataclass(frozen=True)
class Field:
    type: Any
    default: Any
    help: str


def is_section(hint) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def schema_fields(schema: type) -> dict[str, Field]:
    """Each field of a config dataclass: its resolved type, its default and its doc. A section's default is
    left unbuilt (None): its own fields carry theirs, and building it would run its checks, whose imports
    `--help` does without."""
    hints = typing.get_type_hints(schema)
    out = {}
    for f in dataclasses.fields(schema):
        if is_section(hints[f.name]):
            default = None
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = f.default
        out[f.name] = Field(hints[f.name], None if default is dataclasses.MISSING else default,
                            f.metadata.get("help", ""))
    return out


def build(schema: type, values: dict):
    """The config dataclass from typed values (sections missing take their defaults); each dataclass's
    `__post_init__` checks its values."""
    fields = schema_fields(schema)
    return schema(**{k: build(fields[k].type, v) if is_section(fields[k].type) else v for k, v in values.items()})


def help_text(schema: type, usage: str, about: str = "") -> str:
    """Every field with its default, type and doc, section by section; a section's fields are its flags
    --section.field."""
    lines = [f"usage: {usage}", ""]
    if about:
        lines += [about.strip(), ""]
    lines += ["--config takes a YAML file or a shipped config's name (hf_posenc/recipes/configs/). Every field "
              "below is a key", "of its section there and a flag --section.field VALUE that overrides it "
              "(the flag wins). Values are", "YAML (null, true, 1e-4, [512, 1024]); a list field also takes its "
              "items one by one (--section.field 512 1024).", "", "Fields (defaults), as in a config file:"]

    def listing(cls, indent: str):
        fields = schema_fields(cls)
        width = min(36, max((len(f"{n}: {_shown(f.default)}") for n, f in fields.items()
                             if not is_section(f.type)), default=0))
        for name, f in fields.items():
            if is_section(f.type):
                lines.append(f"{indent}{name}:" + (f"    # {f.help}" if f.help else ""))
                listing(f.type, indent + "  ")
            else:
                entry = f"{name}: {_shown(f.default)}"
                lines.append(f"{indent}{entry:<{width}}  ({type_name(f.type)}) {f.help}".rstrip())

    listing(schema, "  ")
    return "\n".join(lines)


def _shown(default) -> str:
    return json.dumps(default, default=str)



UNSET = "(not set)"   # how a change shows a key one side lacks


def differences(key: str, old, new) -> list[tuple[str, object, object]]:
    """(key, old, new) of each setting that differs between two plain values (as a config's JSON holds them),
    a mapping's keys one by one (posenc.factor, eval.tasks); a key one side lacks shows as UNSET."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [change for name in [*old, *(k for k in new if k not in old)]
                for change in differences(f"{key}.{name}" if key else name, old.get(name, UNSET),
                                          new.get(name, UNSET))]
    return [] if same_setting(old, new) else [(key, old, new)]


def plain(value):
    """A setting as a config's JSON holds it (a tuple is a list there)."""
    return json.loads(json.dumps(value, default=str))


def same_setting(a, b) -> bool:
    """Equal as settings: NaN equals NaN, true is not 1, [1, 2] equals (1, 2) (both plain first)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_setting(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_setting, a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def shown_setting(value) -> str:
    """A setting's value as a change names it: its JSON, or UNSET."""
    return UNSET if value is UNSET else json.dumps(value, default=str)


def to_dict(config) -> dict:
    """The config as nested plain values (what a recipe writes beside its results)."""
    return dataclasses.asdict(config)
