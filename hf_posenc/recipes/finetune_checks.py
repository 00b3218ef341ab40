"""The fine-tune recipe's checks before anything loads or is written: the paths (an output never is, holds
or lies inside an input), the corpora, the scheduler and, on the model's skeleton (meta device, no
weights), the attention implementation, the patch, the trainable parameters and the evaluation lengths."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
from pathlib import Path
from typing import Optional

import torch

from ..train import checkpoints as ckpt
from .. import corpora
from .. import loading
from .. import user_input
from ..errors import AlreadyPatchedError, ConfigError, PosEncError
from ..record_reader import read_record
from ..train.positions import Contiguous, PositionScheme, scheme
from ..train.data import load_documents
from ..errors import one_line
from .recipe_config import differences, plain, shown_setting
from ..train.trainable import GROUPS, select_trainable
from .finetune_config import FinetuneConfig, FinetuneDataArgs, FinetuneModelArgs, TrainArgs
from ..assets import resolve_alias
from ..train import teacher as train_teacher
from ..train.hardware import choose_attention
from .finetune_long import LongTraining, check_documents, check_long_training, check_mixed_windows


@dataclasses.dataclass
class Preflight:
    """What the checks found out before anything loads, from the checkpoint's config file only: the contexts,
    the training sequence lengths, the kind of model, the resolved position scheme. (Named so that "plan"
    means one thing in hf_posenc: a patch as data, plan.PatchPlan.)"""
    original_context: int
    target_context: int
    seq_len: int
    short_len: Optional[int]
    causal: bool
    positions: PositionScheme = dataclasses.field(default_factory=Contiguous)   # resolved: target set
    routed_experts: bool = False   # a mixture of experts: which parameters a step uses depends on its tokens
    resume_changes: tuple[str, ...] = ()   # --resume: the settings changed that leave the run as it was
    long_training: LongTraining = dataclasses.field(default_factory=LongTraining)   # train.attention, train.loss
    carried: dict = dataclasses.field(default_factory=dict)   # the RoPE scaling the folder carries (patch_card)

    @property
    def block_len(self) -> int:
        """The tokens of one training block: a window (seq_len), or with train.positions text=span the
        target-long span each window's tokens are taken from."""
        return self.positions.target if self.positions.span else self.seq_len



EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def routes_to_experts(config) -> bool:
    """Whether a model routes tokens to some of its experts (Mixtral, Qwen-MoE, DeepSeek, ...): then a
    step may leave an expert without a gradient, and DDP must look for unused parameters every step."""
    text = config.get_text_config()
    return any(isinstance(getattr(text, k, None), int) and getattr(text, k) > 1 for k in EXPERT_COUNTS)


def check_config(cfg: FinetuneConfig) -> Preflight:
    """Everything that can be refused before the model is loaded and before anything is written: the
    fields, the paths (an output never is, holds or lies inside an input), the corpora, and, on the
    model's skeleton (meta device, no weights), the attention implementation, the patch, the trainable
    parameters and the evaluation lengths."""
    if cfg.train.lora is not None and importlib.util.find_spec("peft") is None:
        raise ConfigError("train.lora needs the peft package, which is not installed: pip install peft "
                          "(or remove train.lora to train the model's own weights)")
    check_schedule(cfg.train)
    ref = resolve_alias(cfg.model.name)
    check_start_folder(ref)   # first: a pipeline's stage started before the stage that makes its model
    check_output_dir(cfg, ref)
    resume_changes = check_resume(cfg)
    for field, spec in (("data.corpus", cfg.data.corpus), ("eval.corpus", cfg.eval.corpus)):
        if spec:
            check_corpus(field, spec, cfg.data)
    try:
        model = loading.meta_model(ref, gguf_file=cfg.model.gguf_file)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"cannot read the model config of {ref!r}: {one_line(err)}") from None
    # refused now, not as a SafetensorError or random weights once the output folder is written and the data packed
    problem = None if cfg.model.gguf_file else loading.weights_problem(ref, model)
    if problem:
        raise ConfigError(f"model.name {ref!r}: {problem}")
    model_config = model.config
    archs = getattr(model_config, "architectures", None) or []
    causal = not archs or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    if cfg.train.objective == "lm" and not causal:
        raise ConfigError(f"train.objective=lm needs a causal LM, but {ref!r} is a {archs[0]}; "
                          f"use train.objective=distill for encoders")
    original = getattr(model_config.get_text_config(), "max_position_embeddings", None)
    if not isinstance(original, int):   # a state-space model (Mamba): no positions, no context to extend
        raise ConfigError(f"{ref!r} is a {model_config.model_type} model with no max_position_embeddings: it has no "
                          f"positions for this recipe to patch or extend (a state-space model reads any length)")
    check_attention(cfg.model, model)
    target, model, exact = check_posenc(cfg, ref, model, original) if cfg.posenc else (original, model, True)
    seq_len = cfg.data.seq_len or target
    if seq_len > target:
        raise ConfigError(f"data.seq_len={seq_len} is longer than the patched context ({target} positions"
                          f"{'' if cfg.posenc else ', no posenc patch'}); raise posenc.max_position_embeddings "
                          f"or lower data.seq_len")
    if cfg.train.objective == "distill" and not train_teacher.reads_position_ids(cfg.train.teacher):
        if seq_len > original:
            raise ConfigError(f"train.objective=distill matches the unpatched model at its original context, so "
                              f"data.seq_len={seq_len} must be <= {original} (or train.teacher self_extend, which "
                              f"reads longer contexts)")
    elif cfg.train.objective == "distill":
        train_teacher.check(cfg.train.teacher, loading.meta_model(ref, gguf_file=cfg.model.gguf_file), target, ref)
    short_len = (cfg.data.short_len or original) if cfg.data.short_share else None
    if short_len is not None and not 2 <= short_len < seq_len:
        default = "" if cfg.data.short_len else " (its default: the original context)"
        raise ConfigError(f"data.short_len={short_len}{default} must be in 2..{seq_len - 1} (below data.seq_len="
                          f"{seq_len}); set data.short_len below {seq_len}, or data.short_share 0 for no short "
                          f"sequences")
    check_trainable(cfg.train, model, ref)
    positions = check_positions(cfg, model, target, seq_len)
    switched, short_tokens = check_mixed_windows(cfg, ref, original, seq_len, positions)
    mixed_short = short_tokens if short_tokens != seq_len else None
    long_training = check_long_training(cfg, model, ref, original, seq_len, short_len or mixed_short, positions,
                                        "data.short_len" if short_len else "train.mixed_windows' short window length")
    long_training = dataclasses.replace(long_training, mixed_share=cfg.train.mixed_windows if switched else 0.0,
                                        switched=switched, short_tokens=short_tokens,
                                        document_mask=check_documents(cfg, model, causal, positions,
                                                                  choose_attention(cfg.model.attn_implementation,
                                                                                   model.config)))
    if exact:
        from ..families.learned_tables import check_length

        for length in cfg.eval.lengths:
            try:
                check_length(model, length)
            except PosEncError as err:
                raise ConfigError(f"eval.lengths: {err}") from None
    from .patch_card import carried_rope

    return Preflight(original, target, seq_len, short_len, causal, positions, routes_to_experts(model_config),
                     resume_changes, long_training=long_training, carried=carried_rope(model_config))


def check_start_folder(ref: str) -> None:
    """A model path that does not exist yet, refused naming the command that makes it where one is known: the best
    folder of a shipped factor search (its output_dir/best), or any search's `best`."""
    path = Path(ref).expanduser()
    if path.name != "best" or path.exists() or "/" not in ref:
        return   # there, not a search's, or a hub id: loading says what is wrong with it
    import yaml

    from . import CONFIGS

    for config in sorted(CONFIGS.glob("*_search_*.yaml")):
        out = (yaml.safe_load(config.read_text()) or {}).get("output_dir")
        if isinstance(out, str) and Path(out).expanduser().resolve() == path.parent.resolve():
            raise ConfigError(f"model.name {ref!r} does not exist yet: it is the best folder of the factor search "
                              f"`hf-posenc search --config {config.stem}`; run that first (it writes {out}/best), "
                              f"then this fine-tune")
    raise ConfigError(f"model.name {ref!r} does not exist yet: a factor search's best folder is made by "
                      f"`hf-posenc search --output_dir {path.parent}`; run the search first")


def check_positions(cfg: FinetuneConfig, model, context: int, window: int) -> PositionScheme:
    """train.positions, resolved (its target: the patched context unless it names one), for a model whose
    distances are set by its position ids, and a window the target holds."""
    chosen = scheme(cfg.train.positions)
    if not chosen.spreads:
        return chosen.resolve(context)
    where = f"train.positions={cfg.train.positions!r}"
    if cfg.train.objective != "lm" and not train_teacher.reads_position_ids(cfg.train.teacher):
        raise ConfigError(f"{where} needs train.objective=lm, or distill from a teacher that reads spread ids "
                          f"(train.teacher: self_extend): the unpatched teacher matches the same tokens at their own "
                          f"positions, inside the original context")
    if cfg.posenc:
        from ..registry import get_method

        method = cfg.posenc["method"]
        reason = get_method(method).skipped_positions
        if reason:
            raise ConfigError(f"{where} cannot train posenc method {method!r}: {reason}")
    else:
        from .. import api

        mechanism = api.describe(model)["mechanism"]
        if mechanism != "rope":
            raise ConfigError(f"{where} needs a RoPE model (distances set by the position ids), but this model's "
                              f"positions are {mechanism!r}: a learned table has one trained row per position and "
                              f"no notion of distance; patch it to rope first (posenc: {{method: rope}})")
    resolved = chosen.resolve(context)
    if resolved.target > context:
        raise ConfigError(f"{where}: target={resolved.target} is past the model's context ({context} positions"
                          f"{'' if cfg.posenc else ', no posenc patch'}); raise posenc.max_position_embeddings or "
                          f"lower the target")
    try:
        resolved.check_window(window)
        resolved.check_draws(window, seed=cfg.train.seed)   # a scheme drawing wrong ids: refused before training
    except PosEncError as err:
        raise ConfigError(f"{where}: {err} (data.seq_len={window})") from None
    if resolved.span and cfg.data.short_share:
        raise ConfigError(f"{where} takes each window from a span of {resolved.target} tokens; data.short_share "
                          f"cuts blocks short, which a span cannot be: use the scheme's contiguous_share= to keep "
                          f"windows at 0..n-1, and data.short_share 0")
    return resolved


def check_resume(cfg: FinetuneConfig) -> tuple[str, ...]:
    """--resume continues the run saved in output_dir, or is refused: every setting is compared with the
    run's finetune_config.json, and a change of one its field declares fixed (finetune_config.FIXED: the model,
    the patch, the data, the optimizer, the schedule, the seed, the position ids) is refused in one line
    naming each such key and its two values. train.steps may change where the learning rate of a step does
    not follow it (constant schedules) and not below the checkpoint's step. Returns the changes taken (the
    cadence, logging, memory knobs, steps), which the run prints."""
    out = Path(cfg.output_dir)
    saved_file = out / "finetune_config.json"
    if not cfg.resume or not out.is_dir():
        return ()
    new_run = "start a new run (another --output_dir, or --overwrite_output_dir to replace this one)"
    if not saved_file.is_file():
        if ckpt.complete_checkpoints(out) or ckpt.incomplete_checkpoints(out):
            raise ConfigError(f"--resume: {str(out)!r} holds checkpoints but no finetune_config.json, so whether "
                              f"this is the same run cannot be told; put the run's finetune_config.json back, or "
                              f"{new_run}")
        foreign = sorted(p.name for p in out.iterdir() if p.name != "finetune_config.json.tmp")
        if foreign:   # a run writes finetune_config.json before anything else: this folder is not a run's
            raise ConfigError(f"--resume: {str(out)!r} holds {user_input.first_names(foreign)} but no "
                              f"finetune_config.json: not a fine-tune run, which --resume would write over; start a "
                              f"new run in another --output_dir")
        return ()   # nothing saved yet: the run starts at step 0 (resume says so)
    try:
        saved = json.loads(saved_file.read_text())
        if not isinstance(saved, dict):
            raise ValueError(f"a {type(saved).__name__}, not a mapping")
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"--resume: {saved_file} cannot be read ({one_line(err)}), so whether this is the same "
                          f"run cannot be told; put the run's finetune_config.json back, or {new_run}") from None
    data = saved.get("data")
    if isinstance(data, dict) and "bos" in data and "framing" not in data:   # saved when data.framing was data.bos
        data["framing"] = {True: "bos", False: "none"}.get(data.pop("bos"), "auto")
    refused, taken = [], []
    for key, may_change, old, new in setting_changes(cfg, saved):
        change = f"{key} {shown_setting(old)} -> {shown_setting(new)}"
        why = steps_change_problem(cfg, out, old, new) if key == "train.steps" else None
        if not may_change or why:
            refused.append(change + (f" ({why})" if why else ""))
        else:
            taken.append(change)
    if refused:
        raise ConfigError(f"--resume continues the run saved in {str(out)!r}, but this command changes what it "
                          f"trains: {', '.join(refused)} (the run's settings are in {saved_file}); resume with the "
                          f"saved values, or {new_run}")
    return tuple(taken)


def setting_changes(cfg, saved: dict, prefix: str = "") -> list[tuple[str, bool, object, object]]:
    """(key, whether --resume may change it, saved value, new value) of each setting of `cfg` that differs
    from the `saved` config (a mapping as finetune_config.json holds it), a mapping's keys one by one
    (posenc.factor). A key the saved config lacks (a setting added since) counts as its default, which that
    run used; fields of PER_COMMAND are not compared."""
    changes = []
    for f in dataclasses.fields(cfg):
        new, key = getattr(cfg, f.name), prefix + f.name
        if dataclasses.is_dataclass(new):   # a section
            inner = saved.get(f.name)
            changes += setting_changes(new, inner if isinstance(inner, dict) else {}, key + ".")
            continue
        if f.metadata.get("per_command"):
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        changes += [(name, f.metadata["resume_may_change"], old, now)
                    for name, old, now in differences(key, plain(saved.get(f.name, default)), plain(new))]
    return changes


def steps_change_problem(cfg: FinetuneConfig, out: Path, old, new: int) -> Optional[str]:
    """Why a resume cannot change train.steps from `old` to `new`, or None: the checkpoint it continues from
    is past the new end, or the scheduler sets each step's learning rate from train.steps (linear, cosine,
    ...: the steps already taken had another schedule)."""
    reached = ckpt.latest_checkpoint(out)[1]
    if new < reached:
        return f"the checkpoint --resume continues from is at step {reached}, past the new end"
    if not isinstance(old, int) or isinstance(old, bool) or old < 1:
        return None if old == new else "the saved train.steps is not a step count"
    if lr_follows_steps(cfg.train, old, new):
        return (f"train.scheduler {cfg.train.scheduler!r} sets each step's learning rate from train.steps, so the "
                f"steps taken had another schedule; constant and constant_with_warmup can be extended")
    return None


def lr_follows_steps(train: TrainArgs, old: int, new: int) -> bool:
    """Whether the scheduler's learning rate at a step depends on train.steps: its factors over the steps
    both lengths take, built for each length (a scheduler that is not a LambdaLR counts as depending)."""
    from transformers import get_scheduler

    def factors(steps: int):
        probe = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = get_scheduler(train.scheduler, probe, num_warmup_steps=train.warmup_steps,
                                  num_training_steps=steps)
        lambdas = getattr(scheduler, "lr_lambdas", None)
        return None if not lambdas else [lambdas[0](s) for s in range(min(old, new) + 1)]

    before = factors(old)
    return before is None or before != factors(new)


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


def _inputs(cfg: FinetuneConfig, ref: str) -> list[tuple[str, str]]:
    """The local paths the run reads: the model (its folder, or the folder of its .gguf file) and the corpora."""
    try:
        name, extra = loading.resolve(ref, cfg.model.gguf_file)
    except OSError as err:
        raise ConfigError(f"cannot read the model config of {ref!r}: {err}") from None
    found = [("model folder" if not extra else "folder of the model's .gguf file", name)]
    for field, spec in (("data.corpus", cfg.data.corpus), ("eval.corpus", cfg.eval.corpus)):
        if spec:
            found += [(field, str(path)) for path in corpora.corpus_paths(spec)]
    return [(what, path) for what, path in found if Path(path).exists()]


def check_output_dir(cfg: FinetuneConfig, ref: str) -> None:
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
    cwd = Path.cwd().resolve()
    if cfg.overwrite_output_dir and not cfg.resume and (where == cwd or where in cwd.parents):
        raise ConfigError(f"output_dir {cfg.output_dir!r} is or contains the current folder, which "
                          f"--overwrite_output_dir would delete: name the run's own folder")


def check_corpus(field: str, spec: str, args: FinetuneDataArgs) -> None:
    """Built-in and local corpora are read (and must hold some text); a hub dataset must answer."""
    name, _, subset = spec.partition(":")
    files = [] if name in corpora.BUILTIN else corpora._local_files(spec)
    if name in corpora.BUILTIN or files:
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
    elif corpora.names_missing_files(spec):
        raise ConfigError(f"no data files match {spec!r} (expected {', '.join(sorted(corpora.FILE_LOADERS))} "
                          f"files: a path, a folder or a glob)")
    else:
        import datasets

        try:
            datasets.load_dataset_builder(name, subset or None)
        except Exception as err:   # offline, unknown name, gated, ...
            raise ConfigError(f"{field}={spec!r}: the hub dataset {name!r} cannot be reached "
                              f"({type(err).__name__}: {one_line(err)}); use the built-in shakespeare, kjv or stdlib, "
                              f"local .txt/.jsonl/.parquet files, or a reachable hub dataset") from None


def check_attention(args: FinetuneModelArgs, model) -> None:
    requested = choose_attention(args.attn_implementation, model.config)
    try:
        model.set_attn_implementation(requested)
    except (ValueError, ImportError) as err:
        raise ConfigError(f"model.attn_implementation={args.attn_implementation!r} cannot be used: "
                          f"{one_line(err)}") from None


def check_posenc(cfg: FinetuneConfig, ref: str, model, original: int):
    """The patch, dry-run on the skeleton: (target context, patched skeleton, True); for a method that needs
    the weights to run (sinusoidal's fit), its parameters are checked and the skeleton is left unpatched
    (target, fresh skeleton, False)."""
    from .. import api
    from ..registry import get_method

    params = {k: v for k, v in cfg.posenc.items() if k != "method"}
    try:
        api.patch(model, cfg.posenc["method"], **params)
        return int(model.config.get_text_config().max_position_embeddings), model, True
    except AlreadyPatchedError:   # the API's advice (hp.unpatch) is not one a config can follow
        raise ConfigError(f"posenc {_compact(cfg.posenc)} on {ref!r}: the model is already patched (method "
                          f"{read_record(model.config).method!r}); leave posenc out to train the patch it carries, "
                          f"or start from the model it was patched from") from None
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


def prepare_output_dir(cfg: FinetuneConfig) -> None:
    out = Path(cfg.output_dir)
    if cfg.overwrite_output_dir and not cfg.resume and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


# accelerate launch passes a template's engine to each process as these variables; on CPU-only processes
# accelerate (1.15, state.py) turns on neither engine, and runs plain data parallelism without a word.
ENGINES = {"ACCELERATE_USE_FSDP": ("FSDP", "fsdp.yaml"),
           "ACCELERATE_USE_DEEPSPEED": ("DeepSpeed", "deepspeed_zero3.yaml")}


def check_engine(cpu: bool, attn_implementation: str = "sdpa") -> None:
    """Refuse a sharding engine the launcher asked for that this machine's processes would not run: FSDP or
    DeepSpeed on a machine without an accelerator would be DDP, each process holding the whole model; and an
    attention kernel that cannot train here (FlexAttention has no backward on CPU: it failed at step 1)."""
    import os

    import accelerate
    import torch

    if cpu and attn_implementation == "flex_attention":
        raise ConfigError(f"model.attn_implementation=flex_attention cannot train on this machine (CPUs only): torch "
                          f"{torch.__version__} has no FlexAttention backward on CPU; use sdpa (data.packing "
                          f"documents works with it too)")

    for variable, (engine, template) in ENGINES.items():
        if cpu and os.environ.get(variable, "false").lower() == "true":
            raise ConfigError(f"the launcher asks for {engine} (recipes/accelerate/{template}), which accelerate "
                              f"{accelerate.__version__} runs only on GPUs: on this machine, CPUs only, each process "
                              f"would hold the whole model (plain data parallelism); launch with "
                              f"--config_file recipes/accelerate/ddp.yaml --num_processes N instead")
