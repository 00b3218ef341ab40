"""The reusable pieces of `recipes/finetune.py`: its typed config, the checks that run before anything
is loaded, data preparation (cached), what trains, the two objectives, evaluation, checkpoints, the
model card. The recipe itself stays the readable top-level accelerate loop."""

import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import re
import resource
import shutil
import sys
import typing
from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
import yaml

from . import data as hdata
from . import loading
from .errors import PosEncError


class ConfigError(PosEncError, ValueError):
    """A fine-tuning config that cannot work; raised before the model is loaded or anything is written."""


class TrainingDiverged(PosEncError, ValueError):
    """The loss became NaN or inf: the run stops, its last checkpoint is kept."""


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ----------------------------------------------------------------------------------------------- config
@dataclasses.dataclass
class ModelArgs:
    name: str = "smollm2"                # hub id, folder, .gguf file, or the aliases smollm2 / minilm
    gguf_file: Optional[str] = None
    attn_implementation: str = "auto"     # auto: flash_attention_2 when installed on a GPU, else sdpa
    dtype: str = "auto"                   # auto: float32 weights, bf16 mixed precision where supported; or bfloat16 / float32
    gradient_checkpointing: bool = False

    def __post_init__(self):
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ConfigError(f"model.dtype must be auto, bfloat16, float16 or float32, got {self.dtype!r}")
        _need(bool(self.name.strip()), "model.name must name a hub id, a folder or a .gguf file, got ''")


@dataclasses.dataclass
class DataArgs:
    corpus: str = "shakespeare"           # hf_posenc.data.load_corpus spec: built-in, local files, or hub NAME[:CONFIG]
    split: str = "train"
    text_column: str = "text"
    streaming: bool = False               # hub datasets: stream and keep the first max_documents
    max_documents: Optional[int] = None
    seq_len: Optional[int] = None         # default: the patched context
    short_share: float = 0.0              # share of sequences cut to short_len (keeps short-context quality)
    short_len: Optional[int] = None       # default: the original context
    bos: Union[bool, str] = "auto"        # BOS before each document: auto (as the tokenizer starts an input), true, false
    shuffle: bool = True
    cache_dir: Optional[str] = None       # default: $HF_POSENC_CACHE/data

    def __post_init__(self):
        if self.seq_len is not None and self.seq_len < 2:
            raise ConfigError(f"data.seq_len must be >= 2, got {self.seq_len}")
        if not 0.0 <= self.short_share < 1.0:
            raise ConfigError(f"data.short_share must be in [0, 1), got {self.short_share}")
        if not (isinstance(self.bos, bool) or self.bos == "auto"):
            raise ConfigError(f"data.bos must be auto, true or false, got {self.bos!r}")
        if self.streaming and not self.max_documents:
            raise ConfigError("data.streaming needs data.max_documents (how many documents to take from the stream)")
        _need(bool(self.corpus.strip()), "data.corpus must name a corpus (built-in, local files or a hub dataset), "
                                         "got ''")
        _need(self.max_documents is None or self.max_documents >= 1,
              f"data.max_documents must be >= 1 (or null), got {self.max_documents}")
        _need(self.short_len is None or self.short_len >= 2, f"data.short_len must be >= 2 (or null), got {self.short_len}")


@dataclasses.dataclass
class TrainArgs:
    objective: str = "lm"                 # lm | distill
    steps: int = 400                      # optimizer steps
    batch_size: int = 1                   # sequences per process per micro-batch
    grad_accum: int = 1
    lr: float = 2e-5
    betas: list = dataclasses.field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.0
    eps: float = 1e-8
    scheduler: str = "constant_with_warmup"   # any transformers.get_scheduler name
    warmup_steps: int = 20
    max_grad_norm: Optional[float] = 1.0
    trainable: Union[str, list] = "all"   # all, or a list of groups (embeddings, norms, attention, mlp, head) / regexes
    lora: Optional[dict] = None           # {r, alpha, dropout, target_modules}; needs peft
    temperature: float = 1.0              # distill, causal LMs: KL at this temperature
    seed: int = 42
    save_every: int = 100                 # accelerator.save_state every N steps (and at the end)
    keep_checkpoints: int = 2
    report_to: Optional[str] = None       # accelerate tracker: tensorboard, wandb, all, ...
    stop_after_steps: Optional[int] = None  # stop (as if killed) after this many steps; for testing resume
    loss_chunk: int = 1024                # causal LMs: output layer + loss this many positions at a time (0: all)

    def __post_init__(self):
        if self.objective not in ("lm", "distill"):
            raise ConfigError(f"train.objective must be 'lm' or 'distill', got {self.objective!r}")
        for name in ("steps", "batch_size", "grad_accum", "save_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if not (isinstance(self.betas, list) and len(self.betas) == 2 and all(map(_is_number, self.betas))
                and all(0 <= b < 1 for b in self.betas)):
            raise ConfigError(f"train.betas must be a list of two numbers in [0, 1) (AdamW's beta1, beta2), "
                              f"got {self.betas!r}")
        self.betas = [float(b) for b in self.betas]
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"train.lr must be a positive number, got {self.lr}")
        for name in ("weight_decay", "eps", "warmup_steps", "seed"):
            _need(0 <= getattr(self, name) < math.inf, f"train.{name} must be >= 0, got {getattr(self, name)}")
        _need(self.max_grad_norm is None or 0 < self.max_grad_norm < math.inf,
              f"train.max_grad_norm must be a positive number (or null: no clipping), got {self.max_grad_norm}")
        _need(0 < self.temperature < math.inf, f"train.temperature must be a positive number, got {self.temperature}")
        _need(self.loss_chunk >= 0, f"train.loss_chunk must be >= 0 (0: the full logits at once), got {self.loss_chunk}")
        _need(self.keep_checkpoints >= 1, f"train.keep_checkpoints must be >= 1 (--resume needs one), "
                                          f"got {self.keep_checkpoints}")
        _need(self.stop_after_steps is None or self.stop_after_steps >= 1,
              f"train.stop_after_steps must be >= 1 (or null), got {self.stop_after_steps}")
        trainable = [self.trainable] if isinstance(self.trainable, str) else self.trainable
        _need(isinstance(trainable, list) and trainable and all(isinstance(t, str) and t for t in trainable),
              f"train.trainable must be 'all', a group ({', '.join(GROUPS)}) or a regex, or a list of them; "
              f"got {self.trainable!r}")
        if self.report_to is not None:
            from accelerate.utils import LoggerType

            trackers = [t.value for t in LoggerType]
            _need(self.report_to in trackers, f"train.report_to={self.report_to!r} is not one of {', '.join(trackers)}"
                                              f" (or null)")
        if self.lora is not None:
            self.lora = check_lora(self.lora)


@dataclasses.dataclass
class EvalArgs:
    lengths: list = dataclasses.field(default_factory=list)   # perplexity at these lengths, before and after
    corpus: Optional[str] = None          # held-out text (default: data.corpus)
    documents: int = 4
    every: Optional[int] = None           # also evaluate every N steps during training (into log.jsonl)

    def __post_init__(self):
        lengths = [self.lengths] if _is_number(self.lengths) else self.lengths   # `lengths: 512` means [512]
        _need(isinstance(lengths, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 2
                                                 for n in lengths),
              f"eval.lengths must be a list of token counts >= 2 (e.g. [512, 1024]), got {self.lengths!r}")
        self.lengths = lengths
        _need(self.documents >= 1, f"eval.documents must be >= 1, got {self.documents}")
        _need(self.every is None or self.every >= 1, f"eval.every must be >= 1 (or null), got {self.every}")
        _need(self.corpus is None or bool(self.corpus.strip()), "eval.corpus must name a corpus or be null, got ''")


@dataclasses.dataclass
class Config:
    model: ModelArgs
    data: DataArgs
    train: TrainArgs
    eval: EvalArgs
    posenc: Optional[dict] = None         # {method: yarn, max_position_embeddings: 32768, ...}; None: no patch
    output_dir: str = "outputs/finetune"
    overwrite_output_dir: bool = False
    resume: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = {"model": ModelArgs, "data": DataArgs, "train": TrainArgs, "eval": EvalArgs}
TOP_LEVEL = ("posenc", "output_dir", "overwrite_output_dir", "resume")


def _coerce(cls, name: str, key: str, value):
    """YAML reads 2e-5 as a string and 1 where 1.0 is meant: cast to the field's declared type."""
    hint = typing.get_type_hints(cls)[key]
    args = typing.get_args(hint)
    if value is None:
        if type(None) in args or hint is Any:
            return None
        raise ConfigError(f"{name} cannot be null")
    target = next((a for a in args if a is not type(None)), hint) if typing.get_origin(hint) is Union and \
        len([a for a in args if a is not type(None)]) == 1 else hint
    try:
        if target is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "false", "1", "0", "yes", "no"):
                return str(value).lower() in ("true", "1", "yes")
            raise ValueError
        if target is int:
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if target is float:
            return float(value)
        if target is str:
            if isinstance(value, (list, dict)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be of type {target.__name__}, got {value!r}") from None
    return value


def _build(cls, section: str, values: dict):
    if not isinstance(values, dict):
        raise ConfigError(f"'{section}' must be a mapping of fields, got {values!r}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"unknown field(s) {unknown} in '{section}'; allowed: {', '.join(sorted(fields))}")
    return cls(**{k: _coerce(cls, f"{section}.{k}", k, v) for k, v in values.items()})


def parse_config(argv: list[str] | None = None) -> Config:
    """`--config FILE.yaml` then overrides: `--train.lr 1e-4`, `--posenc.factor 4`, `--output_dir d`,
    `--resume`, `--overwrite_output_dir`. Values are read as YAML (`--eval.lengths [512,1024]`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(config_help())
        raise SystemExit(0)
    if not argv:   # not a 400-step SmolLM2 run by surprise
        raise ConfigError("no config given: pass --config FILE.yaml (recipes/configs/) and/or --section.field "
                          "overrides; --help lists every field")
    raw: dict = {}
    overrides: list[tuple[str, Any]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; use --config FILE and --section.field VALUE overrides")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if key in ("resume", "overwrite_output_dir") and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
                value = "true"
            else:
                if i + 1 == len(argv):
                    raise ConfigError(f"--{key} needs a value")
                i, value = i + 1, argv[i + 1]
        if key == "config":
            raw = read_yaml_config(value)
        else:
            overrides.append((key, _yaml_value(f"--{key}", value)))
        i += 1
    for key, value in overrides:
        section, dot, field = key.partition(".")
        if dot:
            if section not in SECTIONS and section != "posenc":
                raise ConfigError(f"unknown section {section!r} in --{key}; sections: {', '.join([*SECTIONS, 'posenc'])}")
            raw.setdefault(section, None)
            raw[section] = {**(raw[section] or {}), field: value}
        else:
            raw[key] = value
    unknown = sorted(set(raw) - set(SECTIONS) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown}; allowed: {', '.join([*SECTIONS, *TOP_LEVEL])}")
    output_dir = raw.get("output_dir", Config.output_dir)
    if not (isinstance(output_dir, str) and output_dir.strip()):
        raise ConfigError(f"output_dir must be a folder path, got {output_dir!r}")
    posenc = raw.get("posenc")
    if posenc is not None and not (isinstance(posenc, dict) and "method" in posenc):
        raise ConfigError(f"posenc must be a mapping with a 'method' (e.g. {{method: yarn, factor: 4}}), got {posenc!r}")
    return Config(
        **{name: _build(cls, name, raw.get(name) or {}) for name, cls in SECTIONS.items()},
        posenc=posenc,
        output_dir=output_dir,
        overwrite_output_dir=_coerce(Config, "overwrite_output_dir", "overwrite_output_dir",
                                     raw.get("overwrite_output_dir", False)),
        resume=_coerce(Config, "resume", "resume", raw.get("resume", False)),
    )


def read_yaml_config(value: str) -> dict:
    """The --config file (or a shipped config's name) as a mapping; a missing file, a folder or a YAML
    error is one clear line."""
    from .recipes import config_path, shipped_configs

    path = Path(value)
    if path.is_dir():
        raise ConfigError(f"--config {value!r} is a folder; give a YAML file (e.g. recipes/configs/*.yaml)")
    path = config_path(value)
    if path is None:
        raise ConfigError(f"config file not found: {value!r} (nor a shipped config: "
                          f"{', '.join(n for n in shipped_configs() if n.endswith('_finetune'))})")
    try:
        raw = yaml.safe_load(path.read_text())
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {value!r} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {value!r} is not valid YAML: {_yaml_problem(err)}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {value!r} must be a mapping of sections (model, data, train, ...), "
                          f"got a {type(raw).__name__}")
    return raw


def _yaml_value(name: str, text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{name} {text!r} is not a YAML value: {_yaml_problem(err)}") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    return where + " ".join(problem.split()) + (" (YAML does not allow tabs for indentation)" if "\\t" in problem else "")


def _type_name(hint) -> str:
    if typing.get_origin(hint) is Union:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(hint))
    return {dict: "mapping"}.get(hint, getattr(hint, "__name__", str(hint)))


def config_help() -> str:
    """What `--help` prints: every section's fields with their types and defaults."""
    lines = ["usage: finetune.py --config FILE.yaml [--section.field VALUE ...] [--resume] [--overwrite_output_dir]",
             "", "Values are YAML (--eval.lengths [512,1024]); a field given on the command line overrides the file.",
             "Fields (defaults):"]
    for section, cls in SECTIONS.items():
        lines.append(f"  {section}:")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            lines.append(f"    {f.name}: {json.dumps(default)}    ({_type_name(hints[f.name])})")
    from .registry import METHODS

    lines += ["  posenc: null    (or {method: NAME, max_position_embeddings: N | factor: F, ...}; methods: "
              f"{', '.join(sorted(METHODS))}; parameters: hf-posenc methods)",
              f"  output_dir: {json.dumps(Config.output_dir)}", "  overwrite_output_dir: false", "  resume: false"]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ checks before loading
@dataclasses.dataclass
class Plan:
    """What the checks found out, from the config file of the checkpoint only."""
    original_context: int
    target_context: int
    seq_len: int
    short_len: Optional[int]
    causal: bool


def check_config(cfg: Config) -> Plan:
    """Everything that can be refused before the model is loaded and before anything is written: the
    fields, the paths (an output never is, holds or lies inside an input), the corpora, and, on the
    model's skeleton (meta device, no weights), the attention implementation, the patch, the trainable
    parameters and the evaluation lengths."""
    if cfg.train.lora is not None and importlib.util.find_spec("peft") is None:
        raise ConfigError("train.lora needs the peft package, which is not installed: pip install peft "
                          "(or remove train.lora to train the model's own weights)")
    check_schedule(cfg.train)
    ref = _model_ref(cfg.model)
    check_output_dir(cfg, ref)
    for field, spec in (("data.corpus", cfg.data.corpus), ("eval.corpus", cfg.eval.corpus)):
        if spec:
            check_corpus(field, spec, cfg.data)
    try:
        model = loading.meta_model(ref, gguf_file=cfg.model.gguf_file)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"cannot read the model config of {ref!r}: {one_line(err)}") from None
    folder = Path(ref)
    weights = [f for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern)] if folder.is_dir() else []
    if folder.is_dir() and not cfg.model.gguf_file and not weights:
        raise ConfigError(f"the model folder {ref!r} holds a config but no weights (*.safetensors or *.bin)")
    config = model.config
    archs = getattr(config, "architectures", None) or []
    causal = not archs or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    if cfg.train.objective == "lm" and not causal:
        raise ConfigError(f"train.objective=lm needs a causal LM, but {ref!r} is a {archs[0]}; "
                          f"use train.objective=distill for encoders")
    original = int(config.get_text_config().max_position_embeddings)
    check_attention(cfg.model, model)
    target, model, exact = check_posenc(cfg, ref, model, original) if cfg.posenc else (original, model, True)
    seq_len = cfg.data.seq_len or target
    if seq_len > target:
        raise ConfigError(f"data.seq_len={seq_len} is longer than the patched context ({target} positions"
                          f"{'' if cfg.posenc else ', no posenc patch'}); raise posenc.max_position_embeddings "
                          f"or lower data.seq_len")
    if cfg.train.objective == "distill" and seq_len > original:
        raise ConfigError(f"train.objective=distill matches the unpatched model at its original context, so "
                          f"data.seq_len={seq_len} must be <= {original}")
    short_len = (cfg.data.short_len or original) if cfg.data.short_share else None
    if short_len is not None and not 2 <= short_len < seq_len:
        raise ConfigError(f"data.short_len={short_len} must be in 2..{seq_len - 1} (below data.seq_len)")
    check_trainable(cfg.train, model, ref)
    if exact:
        from .families.learned_tables import check_length

        for length in cfg.eval.lengths:
            try:
                check_length(model, length)
            except PosEncError as err:
                raise ConfigError(f"eval.lengths: {err}") from None
    return Plan(original, target, seq_len, short_len, causal)


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


METRIC_SCHEDULERS = ("reduce_lr_on_plateau", "greedy")   # step on a metric; the recipe steps by count


def check_schedule(train: TrainArgs) -> None:
    """The scheduler is one transformers builds from (warmup, steps) alone, and the warmup fits the run."""
    from transformers import get_scheduler
    from transformers.trainer_utils import SchedulerType

    names = [s.value for s in SchedulerType if s.value not in METRIC_SCHEDULERS]
    if train.scheduler not in names:
        raise ConfigError(f"train.scheduler={train.scheduler!r} is not one of {', '.join(names)}")
    if train.warmup_steps > train.steps and train.scheduler != "constant":
        raise ConfigError(f"train.warmup_steps={train.warmup_steps} is more than train.steps={train.steps}: the "
                          f"learning rate would never reach train.lr; lower train.warmup_steps")
    probe = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=train.lr)
    try:
        get_scheduler(train.scheduler, probe, num_warmup_steps=train.warmup_steps, num_training_steps=train.steps)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"train.scheduler={train.scheduler!r} needs arguments the recipe does not pass "
                          f"({one_line(err)}); choose one of linear, cosine, constant_with_warmup, ...") from None


def _inputs(cfg: Config, ref: str) -> list[tuple[str, str]]:
    """The local paths the run reads: the model (its folder, or the folder of its .gguf file) and the corpora."""
    try:
        name, extra = loading.resolve(ref, cfg.model.gguf_file)
    except OSError as err:
        raise ConfigError(f"cannot read the model config of {ref!r}: {err}") from None
    found = [("model folder" if not extra else "folder of the model's .gguf file", name)]
    for field, spec in (("data.corpus", cfg.data.corpus), ("eval.corpus", cfg.eval.corpus)):
        if spec:
            found += [(field, spec)] if Path(spec).exists() else [(field, f) for f in hdata._local_files(spec)]
    return [(what, path) for what, path in found if Path(path).exists()]


def check_output_dir(cfg: Config, ref: str) -> None:
    """output_dir is a folder (or nothing yet), never an input, an input's folder or inside one (resolved,
    symlinks followed), and not a previous run's unless --resume or --overwrite_output_dir says so."""
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {cfg.output_dir!r} is a file; give a folder")
    where = out.expanduser().resolve()
    for what, path in _inputs(cfg, ref):
        source = Path(path).expanduser().resolve()
        relation = ("is" if where == source else "lies inside" if source in where.parents
                    else "contains" if where in source.parents else None)
        if relation:
            raise ConfigError(f"output_dir {cfg.output_dir!r} {relation} the {what} {path!r}, which the run "
                              f"reads; an output must not overwrite its input: choose another --output_dir")
    if out.exists() and any(out.iterdir()) and not (cfg.resume or cfg.overwrite_output_dir):
        raise ConfigError(f"output_dir {str(out)!r} exists and is not empty; pass --resume to continue its run, "
                          f"--overwrite_output_dir to replace it, or choose another --output_dir")


def check_corpus(field: str, spec: str, args: DataArgs) -> None:
    """Built-in and local corpora are read (and must hold some text); a hub dataset must answer."""
    name, _, subset = spec.partition(":")
    files = [] if name in hdata.BUILTIN else hdata._local_files(spec)
    if name in hdata.BUILTIN or files:
        try:
            docs = load_documents(args, spec)
        except Exception as err:   # a malformed file, an unknown play, ...: the loader's own words, one line
            cause = err.__cause__ or err.__context__
            why = f"{type(err).__name__}: {one_line(err)}" + (f" ({type(cause).__name__}: {one_line(cause)})"
                                                               if cause is not None else "")
            raise ConfigError(f"{field}={spec!r} cannot be read: {why[:400]}") from None
        if not any(row["text"] and row["text"].strip() for row in docs):   # stops at the first text
            raise ConfigError(f"{field}={spec!r} holds no text ({len(docs)} document(s), all empty): nothing "
                              f"to train or evaluate on")
    elif Path(spec).is_dir() or hdata._looks_like_path(spec):
        raise ConfigError(f"no data files match {spec!r} (expected {', '.join(sorted(hdata.FILE_LOADERS))} "
                          f"files: a path, a folder or a glob)")
    else:
        import datasets

        try:
            datasets.load_dataset_builder(name, subset or None)
        except Exception as err:   # offline, unknown name, gated, ...
            raise ConfigError(f"{field}={spec!r}: the hub dataset {name!r} cannot be reached "
                              f"({type(err).__name__}: {one_line(err)}); use the built-in shakespeare or kjv, "
                              f"local .txt/.jsonl/.parquet files, or a reachable hub dataset") from None


def check_attention(args: ModelArgs, model) -> None:
    requested = choose_attention(args.attn_implementation)
    try:
        model.set_attn_implementation(requested)
    except (ValueError, ImportError) as err:
        raise ConfigError(f"model.attn_implementation={args.attn_implementation!r} cannot be used: "
                          f"{one_line(err)}") from None


def check_posenc(cfg: Config, ref: str, model, original: int):
    """The patch, dry-run on the skeleton: (target context, patched skeleton, True); for a method that needs
    the weights to run (sinusoidal's fit), its parameters are checked and the skeleton is left unpatched
    (target, fresh skeleton, False)."""
    from . import api
    from .registry import get_method

    params = {k: v for k, v in cfg.posenc.items() if k != "method"}
    try:
        api.patch(model, cfg.posenc["method"], **params)
        return int(model.config.get_text_config().max_position_embeddings), model, True
    except PosEncError as err:
        raise ConfigError(f"posenc {_compact(cfg.posenc)} on {ref!r}: {one_line(err)}") from None
    except (NotImplementedError, RuntimeError) as err:
        if "meta" not in str(err):
            raise ConfigError(f"posenc {_compact(cfg.posenc)} on {ref!r}: {one_line(err)}") from None
    except Exception as err:   # the patch's own validation missed it: refuse all the same, in one line
        raise ConfigError(f"posenc {_compact(cfg.posenc)} on {ref!r}: {type(err).__name__}: {one_line(err)}") from None
    target = get_method(cfg.posenc["method"]).from_dict(params).resolve(original).max_position_embeddings
    fresh = loading.meta_model(ref, gguf_file=cfg.model.gguf_file)
    check_attention(cfg.model, fresh)
    return int(target), fresh, False


def _compact(value) -> str:
    return json.dumps(value, default=str)


def check_trainable(train: TrainArgs, model, ref: str) -> None:
    """Each trainable group or regex names parameters of the (patched) model, something is left to train,
    and LoRA's target_modules name modules of it."""
    names = [n for n, _ in model.named_parameters()]
    if train.trainable != "all":
        for entry in [train.trainable] if isinstance(train.trainable, str) else train.trainable:
            try:
                pattern = re.compile(GROUPS.get(entry, entry), re.IGNORECASE)
            except re.error as err:
                raise ConfigError(f"train.trainable entry {entry!r} is not a group ({', '.join(GROUPS)}) nor a "
                                  f"valid regex ({err})") from None
            if not any(pattern.search(n) for n in names):
                raise ConfigError(f"train.trainable entry {entry!r} matches no parameter of {ref!r}; groups: "
                                  f"{', '.join(GROUPS)}; parameter names look like {names[:3]}")
        if train.lora is None:
            select_trainable(model, train.trainable)
    targets = (train.lora or {}).get("target_modules", "all-linear")
    if targets != "all-linear":
        modules = [n for n, _ in model.named_modules()]
        for target in [targets] if isinstance(targets, str) else targets:
            hit = (any(re.fullmatch(target, n) for n in modules) if isinstance(targets, str)
                   else any(n == target or n.endswith("." + target) for n in modules))
            if not hit:
                raise ConfigError(f"train.lora.target_modules entry {target!r} names no module of {ref!r}; "
                                  f"module names look like {[n for n in modules if n][:4]}")


def _model_ref(model: ModelArgs) -> str:
    from .assets import resolve_alias

    return resolve_alias(model.name)


def prepare_output_dir(cfg: Config) -> None:
    out = Path(cfg.output_dir)
    if cfg.overwrite_output_dir and not cfg.resume and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------------------------------------- model
def choose_attention(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def mixed_precision(dtype: str) -> str:
    """bf16 mixed precision where the hardware has it (auto), else full precision."""
    if dtype == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def load_model(cfg: Config):
    kwargs = {"attn_implementation": choose_attention(cfg.model.attn_implementation)}
    if cfg.model.dtype != "auto":
        kwargs["dtype"] = getattr(torch, cfg.model.dtype)
    return loading.load_model(_model_ref(cfg.model), gguf_file=cfg.model.gguf_file, **kwargs)


def load_tokenizer(cfg: Config):
    ref = _model_ref(cfg.model)
    try:
        return loading.load_tokenizer(ref, gguf_file=cfg.model.gguf_file)
    except (OSError, ValueError) as err:   # no tokenizer files beside the model, a backend missing, ...
        raise ConfigError(f"cannot load the tokenizer of {ref!r}: {one_line(err)}") from None


GROUPS = {
    "embeddings": r"embed|wte|wpe|position|word_embeddings|token_type",
    "norms": r"norm|ln_|layernorm",
    "attention": r"attn|attention|q_proj|k_proj|v_proj|o_proj",
    "mlp": r"mlp|intermediate|\.output\.dense|fc\d|gate_proj|up_proj|down_proj",
    "head": r"lm_head|score|classifier",
}


def select_trainable(model: torch.nn.Module, spec) -> tuple[int, int]:
    """Freeze what `spec` does not name ("all", or groups / regexes); never unfreezes what is frozen
    (a patch's fixed positions stay fixed). Returns (trainable, total) parameter counts."""
    if spec != "all":
        names = [spec] if isinstance(spec, str) else list(spec)
        pattern = re.compile("|".join(f"(?:{GROUPS.get(n, n)})" for n in names), re.IGNORECASE)
        for name, p in model.named_parameters():
            if not pattern.search(name):
                p.requires_grad_(False)
    params = list(model.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    if trainable == 0:
        raise ConfigError(f"train.trainable={spec!r} leaves no parameter to train")
    return trainable, sum(p.numel() for p in params)


def disable_dropout(model: torch.nn.Module) -> None:
    """For distill: its target is deterministic, and dropout noise in the student only blurs the match
    (MiniLM healing: 0.87 with dropout, 0.94 without, same steps). The saved config keeps its dropout."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):   # Llama-like attention
            module.attention_dropout = 0.0


LORA_KEYS = ("r", "alpha", "dropout", "target_modules")


def check_lora(lora) -> dict:
    _need(isinstance(lora, dict), f"train.lora must be a mapping ({', '.join(LORA_KEYS)}), got {lora!r}")
    unknown = sorted(set(lora) - set(LORA_KEYS))
    _need(not unknown, f"unknown key(s) {unknown} in train.lora; allowed: {', '.join(LORA_KEYS)}")
    r, alpha, dropout = lora.get("r", 8), lora.get("alpha", 16), lora.get("dropout", 0.0)
    _need(isinstance(r, int) and not isinstance(r, bool) and r >= 1, f"train.lora.r must be an int >= 1, got {r!r}")
    _need(isinstance(alpha, int) and not isinstance(alpha, bool) and alpha >= 1,
          f"train.lora.alpha must be an int >= 1, got {alpha!r}")
    _need(_is_number(dropout) and 0 <= dropout < 1, f"train.lora.dropout must be in [0, 1), got {dropout!r}")
    targets = lora.get("target_modules", "all-linear")
    _need(isinstance(targets, str) and targets or isinstance(targets, list) and targets
          and all(isinstance(t, str) and t for t in targets),
          f"train.lora.target_modules must be 'all-linear', a regex or a list of module names, got {targets!r}")
    return lora


def apply_lora(model: torch.nn.Module, lora: dict, trainable) -> torch.nn.Module:
    """LoRA adapters (peft) on `target_modules`; with `trainable` other than "all", those parameters
    train too (LongLoRA trains embeddings and norms alongside the adapters)."""
    import peft

    config = peft.LoraConfig(r=int(lora.get("r", 8)), lora_alpha=int(lora.get("alpha", 16)),
                             lora_dropout=float(lora.get("dropout", 0.0)),
                             target_modules=lora.get("target_modules", "all-linear"))
    extra = [] if trainable == "all" else [n for n, p in model.named_parameters() if p.requires_grad]
    model = peft.get_peft_model(model, config)
    if extra:
        pattern = re.compile("|".join(f"(?:{GROUPS.get(n, n)})" for n in
                                      ([trainable] if isinstance(trainable, str) else trainable)), re.IGNORECASE)
        for name, p in model.named_parameters():
            if pattern.search(name) and "lora_" not in name and not name.endswith("original_module"):
                p.requires_grad_(True)
    return model


# ----------------------------------------------------------------------------------------------- data
def _fingerprint(tokenizer) -> str:
    from datasets.fingerprint import Hasher

    return Hasher.hash(tokenizer)


def frame_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one input (BERT: [CLS], [SEP])."""
    plain, full = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    start = next(i for i in range(len(full)) if full[i:i + len(plain)] == plain)
    return full[:start], full[start + len(plain):]


def boundary_ids(tokenizer, bos: bool) -> tuple[int, Optional[int]]:
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos is None:
        raise ConfigError("the tokenizer has no EOS (nor SEP) token to mark document boundaries")
    bos_id = (tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id) if bos else None
    return eos, bos_id


def load_documents(args: DataArgs, corpus: Optional[str] = None):
    """The corpus as a datasets.Dataset with a "text" column (the first max_documents of a stream)."""
    import datasets

    spec = corpus or args.corpus
    if args.streaming and spec.partition(":")[0] not in hdata.BUILTIN and not hdata._local_files(spec):
        name, _, subset = spec.partition(":")
        stream = datasets.load_dataset(name, subset or None, split=args.split, streaming=True)
        rows = [{"text": r[args.text_column]} for r, _ in zip(stream, range(args.max_documents))]
        return datasets.Dataset.from_list(rows)
    docs = hdata.load_corpus(spec, split=args.split, text_column=args.text_column)
    if args.max_documents:
        docs = docs.select(range(min(args.max_documents, len(docs))))
    return docs


def prepare_data(args: DataArgs, tokenizer, plan: Plan, cache_root: Optional[str] = None):
    """Tokenized, exactly packed sequences (`hf_posenc.data.pack_exact`), cached on disk by what
    determines them (corpus, tokenizer, lengths, boundaries): a second run loads them in a second.
    For encoders, each block is framed as the tokenizer frames one input ([CLS] ... [SEP]), as the
    model always sees it (position 0 is [CLS]), within seq_len.
    Call under `accelerator.main_process_first()`: the main process builds, the others load."""
    import datasets

    eos, bos = boundary_ids(tokenizer, args.bos is True)
    if args.bos is True and bos is None:
        raise ConfigError("data.bos is true, but the tokenizer has no BOS (nor CLS) token; use auto or false")
    if args.bos == "auto":  # a causal LM's documents start as its tokenizer starts an input (Llama, Gemma: BOS)
        bos = next(iter(hdata.bos_prefix(tokenizer)), None) if plan.causal else None
    head, tail = ([], []) if plan.causal else frame_ids(tokenizer)
    key = json.dumps({"corpus": args.corpus, "split": args.split, "column": args.text_column,
                      "max_documents": args.max_documents, "tokenizer": _fingerprint(tokenizer),
                      "seq_len": plan.seq_len, "short_share": args.short_share, "short_len": plan.short_len,
                      "eos": eos, "bos": bos, "frame": [head, tail], "v": 3}, sort_keys=True)
    root = Path(cache_root or args.cache_dir or loading.CACHE_DIR / "data")
    folder = root / hashlib.sha1(key.encode()).hexdigest()[:16]
    if (folder / "dataset_info.json").exists():
        return datasets.load_from_disk(str(folder))
    docs = load_documents(args)
    tokenized = hdata.tokenize(docs, tokenizer, bos=False)  # pack_exact puts the BOS
    extra = len(head) + len(tail)
    packed = hdata.pack_exact(tokenized, plan.seq_len - extra, eos_token_id=eos, bos_token_id=bos,
                              short_share=args.short_share, short_length=plan.short_len and plan.short_len - extra)
    if extra:
        blocks = [head + b + tail for b in packed["input_ids"]]
        packed = datasets.Dataset.from_dict({"input_ids": blocks, "length": [len(b) for b in blocks]})
    packed = trainable_blocks(packed, args.corpus, sum(tokenized["num_tokens"]))
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    packed.save_to_disk(str(tmp))
    (tmp / "key.json").write_text(key)
    os.replace(tmp, folder)
    return datasets.load_from_disk(str(folder))


def trainable_blocks(packed, corpus: str, document_tokens: int):
    """The blocks that teach something: a block of one token predicts nothing, and a batch of such blocks
    has a loss of 0/0 = NaN (the corpus' last block can be one EOS). No document token at all: refused."""
    if document_tokens == 0:
        raise ConfigError(f"data.corpus={corpus!r} gives zero training tokens (its documents are empty once "
                          f"tokenized); nothing to train on")
    keep = [i for i, n in enumerate(packed["length"]) if n >= 2]
    return packed if len(keep) == len(packed) else packed.select(keep)


def collate(pad_id: int):
    """Pads a batch of blocks (only the corpus' last block, or short ones, are shorter): padding gets
    attention 0 and label -100."""
    def fn(rows):
        n = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, :len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask}
    return fn


# ------------------------------------------------------------------------------------------ objectives
# lm_loss, distill_loss and their chunked forms: hf_posenc/losses.py (TrainingLoss)


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model, tokenizer, cfg: Config, plan: Plan, teacher=None) -> dict:
    """Causal LMs: perplexity of the held-out documents at each of eval.lengths (`hf_posenc.eval`).
    Encoders: mean cosine of mean-pooled embeddings to the unpatched model on held-out passages
    (cosine@length) and on the short probe sentences of hf_posenc.assets (cosine_probe)."""
    if not cfg.eval.lengths:
        return {}
    was_training = model.training
    model.eval()
    docs = load_documents(cfg.data, cfg.eval.corpus)
    results = {}
    try:
        if plan.causal:
            from . import eval as hpe

            ids = hdata.tokenize(docs, tokenizer)["input_ids"]
            for length in cfg.eval.lengths:
                chosen = [d[:length] for d in ids if len(d) >= length][:cfg.eval.documents]
                if chosen:
                    results[f"perplexity@{length}"] = hpe.document_perplexity(
                        model, chosen, max_length=length, progress=False)["perplexity"]
        elif teacher is not None:
            from .assets import PROBE_SENTENCES

            passages = held_out_passages(docs["text"], cfg.eval.documents * 8)
            for length in cfg.eval.lengths:
                results[f"cosine@{length}"] = embedding_cosine(model, teacher, tokenizer, passages, length)
            results["cosine_probe"] = embedding_cosine(model, teacher, tokenizer, list(PROBE_SENTENCES),
                                                       max(cfg.eval.lengths))
    finally:
        model.train(was_training)
    return results


def held_out_passages(texts, n: int, min_words: int = 8) -> list[str]:
    """Paragraphs (split at blank lines) of at least `min_words` words, the first n."""
    out = []
    for text in texts:
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            if len(para.split()) >= min_words:
                out.append(para)
                if len(out) == n:
                    return out
    return out


@torch.no_grad()
def embedding_cosine(model, reference, tokenizer, passages: list[str], max_length: int, batch: int = 16) -> float:
    """Mean cosine similarity of the mean-pooled sentence embeddings of two encoders."""
    sims = []
    for i in range(0, len(passages), batch):
        enc = tokenizer(passages[i:i + batch], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt").to(next(model.parameters()).device)
        a, b = (mean_pool(m(**enc).last_hidden_state, enc["attention_mask"]) for m in (model, reference))
        sims.append(F.cosine_similarity(a.float(), b.float(), dim=-1))
    return torch.cat(sims).mean().item()


def mean_pool(hidden, mask):
    mask = mask[..., None].to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)


# --------------------------------------------------------------------------------- checkpoints and logs
def checkpoint_dir(output_dir: str, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:07d}"


def latest_checkpoint(output_dir: str) -> tuple[Optional[Path], int]:
    folders = complete_checkpoints(output_dir)
    return (folders[-1], int(folders[-1].name.split("_")[1])) if folders else (None, 0)


def complete_checkpoints(output_dir: str) -> list[Path]:
    """The checkpoints marked done, oldest first (a checkpoint cut short by a kill has no `done`)."""
    folders = sorted((Path(output_dir) / "checkpoints").glob("step_*"))
    return [f for f in folders if (f / "done").exists()]


MANIFEST = "manifest.json"


def begin_checkpoint(folder: Path) -> None:
    """Before writing into a checkpoint folder (again, after a fallback): it is not done until `mark_done`."""
    (folder / "done").unlink(missing_ok=True)


def mark_done(folder: Path) -> None:
    """Record each file's size, then mark the checkpoint complete: a file truncated later (a full disk, a
    copy cut short) is found by its size before anything is loaded from it."""
    files = {p.relative_to(folder).as_posix(): p.stat().st_size
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in ("done", MANIFEST)}
    (folder / MANIFEST).write_text(json.dumps({"sizes": files}, indent=1))
    (folder / "done").touch()


def checkpoint_problem(folder: Path) -> Optional[str]:
    """What is wrong with a complete checkpoint's files, or None (also for one saved before manifests)."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return None
    try:
        sizes = json.loads(manifest.read_text())["sizes"]
    except (ValueError, KeyError, TypeError):
        return f"{manifest} is unreadable"
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes, {size} when it was saved (truncated or replaced)"
    return None


def step_seed(seed: int, step: int, micro_batch: int) -> int:
    """The RNG seed (dropout) of one micro-batch: a function of where it is in the run alone, so a resumed
    run draws what the uninterrupted one drew. Restoring the RNG state saved with the checkpoint is not
    enough: the resumed run's new DataLoader iterator takes one draw from the global generator (its base
    seed) that the uninterrupted run took at the start of the epoch instead."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}:{micro_batch}".encode()).digest()[:8], "little") >> 1


def prune_checkpoints(output_dir: str, keep: int) -> None:
    folders = sorted((Path(output_dir) / "checkpoints").glob("step_*"))
    for folder in folders[:-keep] if keep > 0 else []:
        shutil.rmtree(folder, ignore_errors=True)


class LossLog:
    """log.jsonl in the output folder, one line per optimizer step; on resume, the lines after the
    checkpoint's step are dropped (those steps run again)."""

    def __init__(self, output_dir: str, resume_step: int, enabled: bool):
        self.path, self.enabled = Path(output_dir) / "log.jsonl", enabled
        if enabled and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def read_log(output_dir: str) -> list[dict]:
    path = Path(output_dir) / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def peak_memory_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


# ------------------------------------------------------------------------------------------ model card
def write_model_card(output_dir: str, cfg: Config, plan: Plan, describe: dict, steps: int, tokens: int,
                     before: dict, after: dict) -> None:
    base = cfg.model.name + (f" ({cfg.model.gguf_file})" if cfg.model.gguf_file else "")
    rows = "\n".join(f"| {k} | {before.get(k, '')} | {after.get(k, '')} |" for k in sorted({*before, *after}))
    evaluation = (f"| metric | before | after |\n|---|---|---|\n{rows}\n" if rows else "not run\n")
    card = f"""---
base_model: {cfg.model.name}
library_name: transformers
tags: [hf_posenc, long-context]
---
# {Path(output_dir).name}

Fine-tuned with `hf_posenc` (`recipes/finetune.py`).

- **Base model**: `{base}` (context {plan.original_context})
- **Positional patch**: `{json.dumps(cfg.posenc) if cfg.posenc else 'none'}` -> context {plan.target_context}
- **Mechanism after patch**: `{json.dumps(describe, default=str)}`
- **Data**: `{cfg.data.corpus}` (split {cfg.data.split}{f', first {cfg.data.max_documents} documents' if cfg.data.max_documents else ''}), packed to {plan.seq_len} tokens{f', {cfg.data.short_share:.0%} cut to {plan.short_len}' if cfg.data.short_share else ''}
- **Objective**: `{cfg.train.objective}`; trainable: `{cfg.train.trainable}`{'; LoRA ' + json.dumps(cfg.train.lora) + ' (merged)' if cfg.train.lora else ''}
- **Steps**: {steps} optimizer steps, {tokens} training tokens; lr {cfg.train.lr}, betas {cfg.train.betas}, weight decay {cfg.train.weight_decay}, warmup {cfg.train.warmup_steps}, {cfg.train.scheduler}, seed {cfg.train.seed}

## Evaluation (held-out `{cfg.eval.corpus or cfg.data.corpus}`)

{evaluation}
Load it with `transformers.AutoModel*.from_pretrained(folder)` or `hf_posenc.from_pretrained(folder)`.
"""
    (Path(output_dir) / "README.md").write_text(card)
