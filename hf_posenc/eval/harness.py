"""lm-evaluation-harness for patched models, and an offline long-context task group.

    from hf_posenc.eval import harness
    lm = harness.HFPosencLM(model, tokenizer)                 # in memory, patched or not
    lm = harness.HFPosencLM("ckpt-32k")                        # a saved checkpoint, patch restored
    harness.write_tasks("tasks/", tokenizer, lengths=[4096, 16384])
    harness.evaluate(lm, "tasks/")["results"]                  # {"hf_posenc_passkey_4096": {"acc,none": ...}, ...}

    harness.evaluate(lm, tasks=["niah_single_1", "ruler_vt"], metadata={"max_seq_lengths": [4096]})  # RULER, offline

    python -m hf_posenc.eval.harness --model hf_posenc --model_args pretrained=ckpt-32k \
        --include_path tasks/ --tasks hf_posenc_long          # lm_eval's own command line, model registered

Two things go wrong with a patched model in plain lm-eval: a checkpoint whose patch stock transformers
cannot express (dynamic, dca, alibi, ...) must be loaded with `hp.from_pretrained`, and lm-eval sizes
its context window from the config, then silently left-truncates every longer request to it.
`HFPosencLM` loads through hf_posenc and sets `max_length` to the patched context.

The tasks are the passkey and needle trials of `hf_posenc.eval.retrieval`, written as local JSON
files with one task per (kind, length) and a group `hf_posenc_long` over all of them; they need no
download. Each is a `loglikelihood` task: a trial counts as right when greedy decoding gives the whole
answer (lm-eval's `acc` on the `is_greedy` flag), the rule of `hf_posenc.eval.score_trials`.

lm-eval's RULER tasks build their samples with a tokenizer they load by name (`AutoTokenizer.from_pretrained`
of the `tokenizer` or `pretrained` model argument: for `smollm2` or a .gguf file, a hub lookup); `evaluate` and
this command line hand them the model's own tokenizer as a local folder (`tokenizer_folder`)."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from .. import api, loading
from ..errors import InvalidInputError, InvalidParameterError, ParameterTypeError, PosEncError
from . import retrieval
from .variants import parse_variant

try:
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("hf_posenc.eval.harness needs lm-evaluation-harness: pip install 'hf_posenc[harness]' "
                      "(or pip install lm-eval)") from err

GROUP = "hf_posenc_long"

# The model arguments HFPosencLM takes: its own, then those of lm-eval's HFLM that act on a model already loaded.
# HFLM ignores its loading arguments (revision, peft, parallelize, ...) for a model object, and sends unknown
# ones to `from_pretrained`, which HFPosencLM does not call: both are refused, not dropped.
OWN_ARGS = ("pretrained", "tokenizer", "patch", "max_length", "dtype", "attn_implementation")
HFLM_ARGS = ("device", "batch_size", "max_batch_size", "truncation", "logits_cache", "softmax_dtype",
             "mixed_precision_dtype", "add_bos_token", "prefix_token_id", "think_end_token", "enable_thinking",
             "chat_template_args")
MODEL_ARGS = OWN_ARGS + HFLM_ARGS


def check_model_args(args: dict) -> None:
    """Refuse model arguments HFPosencLM does not take (a misspelt `dtype=` would otherwise be ignored)."""
    unknown = [name for name in args if name not in MODEL_ARGS]
    if not unknown:
        return
    given = ", ".join(f"{name}={args[name]!r}" for name in unknown)
    close = [match for name in unknown for match in difflib.get_close_matches(str(name), MODEL_ARGS, n=1)]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise InvalidParameterError(f"unknown hf_posenc model argument{'s' if len(unknown) > 1 else ''} {given}{hint}; "
                                f"the model takes: {', '.join(MODEL_ARGS)}")


def context_length(model: torch.nn.Module) -> int:
    """The context a (patched) model is meant to take: the patch's target, else the config's."""
    return int(api.describe(model)["max_position_embeddings"])


@register_model("hf_posenc")
class HFPosencLM(HFLM):
    """lm-eval's HFLM over a model loaded and patched by hf_posenc.

    `pretrained`: a model in memory, or a hub id / folder / .gguf file loaded with `hp.from_pretrained`
    (so a recorded patch is restored). `patch`: a variant applied after loading ("yarn factor=4",
    "dca"; see `hf_posenc.eval.parse_variant`). `max_length` defaults to the patched context."""

    def __init__(self, pretrained=None, tokenizer=None, *, patch: str | None = None, max_length: int | None = None,
                 dtype: str | torch.dtype | None = None, attn_implementation: str | None = None, **kwargs):
        check_model_args(kwargs)
        if pretrained is None:
            raise InvalidParameterError("HFPosencLM needs pretrained=: a model in memory, or a hub id / folder / .gguf "
                                        "file (lm_eval: --model_args pretrained=FOLDER,...)")
        length = _max_length(max_length)
        if isinstance(pretrained, (str, os.PathLike)):
            extra = {k: v for k, v in (("dtype", _dtype(dtype)), ("attn_implementation", attn_implementation))
                     if v is not None}
            ref = str(pretrained)
            if patch is not None:
                parse_variant(patch)  # the method and its parameters, checked before any weights load
            device = _device(kwargs.get("device"))
            tokenizer = tokenizer if tokenizer is not None else _saved_tokenizer(ref)
            pretrained = api.from_pretrained(ref, **extra).eval()
        elif isinstance(pretrained, torch.nn.Module):
            device = None  # a model in memory stays where it is
            _same_device(pretrained, kwargs.get("device"))
        else:
            raise ParameterTypeError(f"pretrained must be a model or a checkpoint path, got {type(pretrained).__name__}")
        if tokenizer is None:
            raise ParameterTypeError("HFPosencLM(model) needs the tokenizer: HFPosencLM(model, tokenizer)")
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = loading.load_tokenizer(str(tokenizer))
        if patch is not None:
            method, params = parse_variant(patch)
            if method != "none":
                api.patch(pretrained, method, **params)
        if device is not None:  # HFLM leaves a model object where it is: lm_eval's --device is applied here
            pretrained.to(device)
        length = length if length is not None else context_length(pretrained)
        kwargs["device"] = str(next(pretrained.parameters()).device)  # what HFLM uses for a model object
        super().__init__(pretrained=pretrained, tokenizer=tokenizer, max_length=length, **kwargs)


def _max_length(value) -> int | None:
    """max_length as a token count >= 1: an int, or its digits as lm_eval's --model_args gives them."""
    if value is None:
        return None
    number = value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        number = int(value)
    elif isinstance(value, float) and value.is_integer():  # lm_eval's arg parser may give 4096.0
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise InvalidParameterError(f"max_length must be a token count >= 1 (the longest request lm-eval sends "
                                    f"unshortened; default: the patched context), got {value!r}")
    return number


def _device(value) -> torch.device | None:
    """Where a model loaded from a path goes: lm_eval's --device. Its default, cuda:0, also reaches a machine
    without CUDA; there the model stays on the CPU, as lm-eval's HFLM does, with a warning."""
    if value is None:
        return None
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        raise InvalidParameterError(f"device must be a torch device (cpu, cuda, cuda:0, mps), got {value!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        warnings.warn(f"device {value}: this machine has no CUDA device, the model runs on the CPU", stacklevel=3)
        return torch.device("cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise InvalidParameterError(f"device {value}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                                    f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


def _same_device(model: torch.nn.Module, value) -> None:
    """A device named beside a model in memory must be the model's own (HFLM would silently ignore it)."""
    if value is None:
        return
    want, have = _device(value), next(model.parameters()).device
    if want.type != have.type or (want.index is not None and have.index is not None and want.index != have.index):
        raise InvalidParameterError(f"device {value}: the model given is on {have}; move it first (model.to(...)) "
                                    f"or leave device out")


def tokenizer_folder(tokenizer) -> str:
    """A local folder holding `tokenizer`, for lm-eval tasks that load their tokenizer by name (RULER:
    `AutoTokenizer.from_pretrained(metadata["tokenizer"])`, which for an alias or a .gguf file goes to the hub).
    Saved once in the hf_posenc cache, under a name taken from its files' content."""
    if not hasattr(tokenizer, "save_pretrained"):
        raise ParameterTypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    root = loading.CACHE_DIR / "tokenizers"
    root.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=".saving-", dir=root))
    try:
        tokenizer.save_pretrained(fresh)
        digest = hashlib.sha1()
        for file in sorted(fresh.iterdir()):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
        folder = root / digest.hexdigest()[:16]
        loading.publish(fresh, folder, "tokenizer_config.json")   # whole or not at all; another run's is kept
        return str(folder)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def _saved_tokenizer(ref: str):
    """The tokenizer saved with the checkpoint `ref`, or a refusal saying how to give one (a folder written
    by `model.save_pretrained` alone has none)."""
    try:
        return loading.load_tokenizer(ref)
    except (OSError, ValueError, TypeError) as err:
        if isinstance(err, PosEncError) and not os.path.isdir(ref):
            raise  # a missing path, a typo of an alias: said as it is
        raise InvalidInputError(
            f"{ref} has no tokenizer transformers can load ({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
            f"save one beside the model (tokenizer.save_pretrained(folder)), or name one: HFPosencLM(..., "
            f"tokenizer=NAME_OR_FOLDER), on lm_eval's command line --model_args pretrained={ref},tokenizer=NAME_OR_FOLDER"
        ) from err


def _dtype(dtype):
    """None (the checkpoint's), a torch dtype, or a name: "auto" as everywhere in hf_posenc (bfloat16 where
    the hardware runs it natively, else float32), float32, bfloat16, float16."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    return loading.resolve_dtype(str(dtype))[0]


def task_name(kind: str, length: int) -> str:
    return f"hf_posenc_{kind}_{length}"


_EXAMPLES = {"lengths": "[4096, 16384]", "kinds": "['passkey']", "depths": "[0.1, 0.5, 0.9]"}


def write_tasks(folder: str | os.PathLike, tokenizer, *, lengths: Sequence[int], kinds: Sequence[str] = ("passkey",),
                depths: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9), trials: int = 2, haystack: str | None = None,
                seed: int = 0) -> list[str]:
    """Write the offline long-context tasks into `folder` (YAML configs + JSON lines), one per kind and
    length, and the group `hf_posenc_long` over them; returns the task names. `kinds`: passkey and/or needle (needle needs a `haystack` text). The trials
    are those of `hf_posenc.eval.make_trials` (same seed, same trials), decoded to text; lm-eval
    tokenizes the text again, so with a merging tokenizer a trial may differ from its token budget by a
    token or two."""
    for name, value in (("lengths", lengths), ("kinds", kinds), ("depths", depths)):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise ParameterTypeError(f"{name} must be a list (e.g. {_EXAMPLES[name]}), got {value!r}")
    unknown = [k for k in kinds if k not in retrieval.KINDS]
    if unknown or not kinds:
        raise InvalidParameterError(f"kinds must name some of {list(retrieval.KINDS)}, got {list(kinds)!r}")
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
        raise InvalidParameterError(f"lengths must be positive ints, got {list(lengths)!r}")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InvalidParameterError(f"the tasks folder {str(folder)!r} is a file")
    rows = {}
    for kind in kinds:  # every trial is built (and may be refused) before anything is written
        for length in lengths:
            built = retrieval.make_trials(kind, tokenizer, lengths=[length], depths=depths, trials=trials,
                                          haystack=haystack, seed=seed)
            rows[kind, length] = [{"context": tokenizer.decode(t.prompt), "answer": tokenizer.decode(t.answer),
                                   "length": t.length, "depth": t.depth} for t in built]
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for (kind, length), docs in rows.items():
        name = task_name(kind, length)
        data = (folder / f"{name}.jsonl").resolve()
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        (folder / f"{name}.yaml").write_text(_task_yaml(name, data))
        names.append(name)
    (folder / f"{GROUP}.yaml").write_text(
        f"group: {GROUP}\ntask:\n" + "".join(f"  - {n}\n" for n in names)
        + "aggregate_metric_list:\n  - metric: acc\n    aggregation: mean\n    weight_by_size: true\n")
    return names


def _task_yaml(name: str, data: Path) -> str:
    # target_delimiter "": the answer carries its own leading space, as the trial was built
    return (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
            "test_split: test\noutput_type: loglikelihood\ndoc_to_text: \"{{context}}\"\n"
            "doc_to_target: \"{{answer}}\"\ntarget_delimiter: \"\"\nmetric_list:\n  - metric: acc\n"
            "    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")


def check_metadata(metadata: dict, context: int | None) -> None:
    """lm-eval's task metadata as RULER reads it, checked before any task is built: `max_seq_lengths` a non-empty
    list of token counts, none past `context` (the model's max_length: lm-eval would cut a longer prompt to it,
    from the left). None: the context is not known yet (a patch that needs the weights), the bound is left out."""
    if "max_seq_lengths" not in metadata:
        return
    value = metadata["max_seq_lengths"]
    usage = ("a non-empty list of token counts >= 1, e.g. [4096, 8192] (on lm_eval's command line "
             "--metadata '{\"max_seq_lengths\": [4096]}')")
    if not isinstance(value, (list, tuple)) or not value or \
            any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in value):
        raise InvalidParameterError(f"metadata max_seq_lengths must be {usage}, got {value!r}")
    if context is not None and max(value) > context:
        raise InvalidParameterError(
            f"metadata max_seq_lengths {list(value)}: {max(value)} is past the model's context of {context} tokens "
            f"(its max_length; lm-eval would cut a longer prompt to it, from the left): use lengths up to {context}, "
            f"or patch the model to a longer context (patch=...)")


def evaluate(lm: HFLM, folder: str | os.PathLike | None = None, tasks: str | Sequence[str] = (GROUP,), *,
             metadata: dict | None = None, log_samples: bool = False, **kwargs) -> dict:
    """Run lm-eval on `tasks`: those `write_tasks` wrote into `folder` (default: the whole group) and lm-eval's own,
    such as RULER's offline ones (`metadata={"max_seq_lengths": [4096]}`). Returns lm-eval's results dict
    ("results" per task and group; "samples" per request when log_samples). Tasks that load a tokenizer by name
    get the model's, as a local folder (metadata "tokenizer", unless given)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = [tasks] if isinstance(tasks, str) else list(tasks)
    if folder is None and tasks == [GROUP]:
        raise InvalidParameterError(f"evaluate: the group {GROUP} lives in the folder write_tasks wrote; pass it "
                                    "(evaluate(lm, folder)), or name lm-eval's tasks (tasks=['niah_single_1'])")
    if metadata is not None and not isinstance(metadata, dict):
        raise ParameterTypeError(f"metadata must be a dict (e.g. {{'max_seq_lengths': [4096]}}), got {metadata!r}")
    check_metadata(metadata or {}, lm.max_length)
    metadata = {"tokenizer": tokenizer_folder(lm.tokenizer), **(metadata or {})}
    manager = None
    if folder is not None:  # the folder's tasks alone when it holds all those asked for: indexing lm-eval's takes ~20 s
        manager = TaskManager(include_path=str(folder), include_defaults=False, metadata=metadata)
        if not all(task in manager.all_tasks for task in tasks):
            manager = None
    if manager is None:
        manager = TaskManager(include_path=None if folder is None else str(folder), metadata=metadata)
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, log_samples=log_samples, **kwargs)


def _prepare_run(args) -> None:
    """`run --model hf_posenc` on lm_eval's parsed command line: unknown model arguments refused before anything
    loads, and the metadata given a `tokenizer` folder (the model's own tokenizer) unless it names one: RULER's
    tasks would otherwise look `pretrained` up on the hub (`smollm2`, a .gguf file)."""
    from lm_eval.utils import simple_parse_args_string

    if getattr(args, "command", None) != "run":
        return
    config = {}
    if getattr(args, "config", None):
        from lm_eval.config.evaluate_config import EvaluatorConfig

        config = EvaluatorConfig.load_yaml_config(args.config)

    def merged(name):  # the command line over the config file, as lm_eval merges them
        parts = [config.get(name), getattr(args, name, None)]
        return {k: v for part in parts if part for k, v in
                (simple_parse_args_string(part) if isinstance(part, str) else part).items()}

    if (args.model or config.get("model")) != "hf_posenc":
        return
    model_args, metadata = merged("model_args"), merged("metadata")
    check_model_args(model_args)
    if not model_args.get("pretrained"):
        return  # no model at all, which HFPosencLM refuses
    if "max_seq_lengths" in metadata:   # before the weights load and RULER builds its samples
        check_metadata(metadata, _context_before_loading(model_args))
    if "tokenizer" in metadata:
        return  # named by the user
    if model_args.get("tokenizer"):
        tokenizer = loading.load_tokenizer(str(model_args["tokenizer"]))
    else:
        tokenizer = _saved_tokenizer(str(model_args["pretrained"]))
    args.metadata = {**metadata, "tokenizer": tokenizer_folder(tokenizer)}


def _context_before_loading(model_args: dict) -> int | None:
    """The context HFPosencLM will take for these model arguments, from the config alone (no weights): max_length
    when given, else the context of the model's skeleton, patched; None for a patch that needs the weights."""
    if model_args.get("max_length") is not None:
        return _max_length(model_args["max_length"])
    skeleton = loading.meta_model(str(model_args["pretrained"]))
    if model_args.get("patch") is not None:
        method, params = parse_variant(str(model_args["patch"]))
        if method != "none":
            try:
                api.patch(skeleton, method, **params)
            except (NotImplementedError, RuntimeError) as err:   # sinusoidal's fit reads the table's weights
                if "meta" not in str(err):
                    raise
                return None
    return context_length(skeleton)


def main(argv: list[str] | None = None) -> int:
    """lm_eval's command line with the `hf_posenc` model registered (this module's import did it); a
    model hf_posenc refuses (a missing path, a bad patch, an unknown model argument) ends as one `error:` line
    and exit code 2."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        setup_logging()
        parser = HarnessCLI()
        args = parser.parse_args()
        _prepare_run(args)
        parser.execute(args)
    except (PosEncError, OSError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
