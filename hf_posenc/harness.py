"""lm-evaluation-harness for patched models, and an offline long-context task group.

    from hf_posenc import harness
    lm = harness.HFPosencLM(model, tokenizer)                 # in memory, patched or not
    lm = harness.HFPosencLM("ckpt-32k")                        # a saved checkpoint, patch restored
    harness.write_tasks("tasks/", tokenizer, lengths=[4096, 16384])
    harness.evaluate(lm, "tasks/")["results"]                  # {"hf_posenc_passkey_4096": {"acc,none": ...}, ...}

    python -m hf_posenc.harness --model hf_posenc --model_args pretrained=ckpt-32k \
        --include_path tasks/ --tasks hf_posenc_long          # lm_eval's own command line, model registered

Two things go wrong with a patched model in plain lm-eval: a checkpoint whose patch stock transformers
cannot express (dynamic, dca, alibi, ...) must be loaded with `hp.from_pretrained`, and lm-eval sizes
its context window from the config, then silently left-truncates every longer request to it.
`HFPosencLM` loads through hf_posenc and sets `max_length` to the patched context.

The tasks are the passkey and needle trials of `hf_posenc.eval.retrieval`, written as local JSON
files with one task per (kind, length) and a group `hf_posenc_long` over all of them; they need no
download. Each is a `loglikelihood` task: a trial counts as right when greedy decoding gives the whole
answer (lm-eval's `acc` on the `is_greedy` flag), the rule of `hf_posenc.eval.score_trials`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from . import api, loading
from .errors import InvalidInputError, InvalidParameterError, ParameterTypeError, PosEncError
from .eval import retrieval
from .eval.variants import parse_variant

try:
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("hf_posenc.harness needs lm-evaluation-harness: pip install 'hf_posenc[harness]' "
                      "(or pip install lm-eval)") from err

GROUP = "hf_posenc_long"


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
            tokenizer = tokenizer if tokenizer is not None else _saved_tokenizer(ref)
            pretrained = api.from_pretrained(ref, **extra).eval()
        elif not isinstance(pretrained, torch.nn.Module):
            raise ParameterTypeError(f"pretrained must be a model or a checkpoint path, got {type(pretrained).__name__}")
        if tokenizer is None:
            raise ParameterTypeError("HFPosencLM(model) needs the tokenizer: HFPosencLM(model, tokenizer)")
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = loading.load_tokenizer(str(tokenizer))
        if patch is not None:
            method, params = parse_variant(patch)
            if method != "none":
                api.patch(pretrained, method, **params)
        length = length if length is not None else context_length(pretrained)
        kwargs.setdefault("device", str(next(pretrained.parameters()).device))
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
    unknown = [k for k in kinds if k not in retrieval.TASKS]
    if unknown or not kinds:
        raise InvalidParameterError(f"kinds must name some of {list(retrieval.TASKS)}, got {list(kinds)!r}")
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


def evaluate(lm: HFLM, folder: str | os.PathLike, tasks: Sequence[str] = (GROUP,), *, log_samples: bool = False,
             **kwargs) -> dict:
    """Run lm-eval on `tasks` (default: the whole group) that `write_tasks` wrote into `folder`; returns
    lm-eval's results dict ("results" per task and group; "samples" per request when log_samples)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(folder))
    return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, log_samples=log_samples,
                                   **kwargs)


def main(argv: list[str] | None = None) -> int:
    """lm_eval's command line with the `hf_posenc` model registered (this module's import did it); a
    model hf_posenc refuses (a missing path, a bad patch) ends as one `error:` line and exit code 2."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        cli_evaluate()
    except (PosEncError, OSError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
