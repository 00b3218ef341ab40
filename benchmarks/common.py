"""What the benchmarks share: the embedded models (SmolLM2-135M from its GGUF file, all-MiniLM-L6-v2), the
text they read (Shakespeare's plays), a clock for wall and process CPU time, side-by-side runs in
alternating order, and the machine line every result is reported with.

    import common                                     # the scripts run as `python benchmarks/bench_x.py`
    model, tokenizer = common.smollm2("float32")
    ids, _ = common.text(tokenizer, 2048)             # the first 2048 tokens of Hamlet
    t = common.timed(lambda: model(torch.tensor([ids])))   # t.value, t.wall, t.cpu
    print(common.machine())

Process CPU time (`time.process_time`) counts only this process's work: with one torch thread on shared,
busy cores it is the steadier measure; wall-clock time is recorded beside it."""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import torch
import transformers

import hf_posenc as hp
from hf_posenc import _compat, assets, corpora
from hf_posenc.loading import resolve_dtype

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # where the benchmarks run their models


DTYPES = ("auto", "float32", "bfloat16", "float16")   # what --dtype takes (choices=common.DTYPES)


def dtype_name(dtype: str | torch.dtype | None) -> str:
    """"float32", "bfloat16", ...; None or "auto": bfloat16 where the hardware runs it natively, else float32.
    Another name is refused (`--dtype float8` ended in an AttributeError once a model was asked for)."""
    if isinstance(dtype, str) and dtype not in DTYPES:
        refuse(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype is None or dtype == "auto":
        dtype = resolve_dtype("auto")[0]
    return str(dtype).removeprefix("torch.")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose own refusals (an unknown flag, a value of the wrong type, a count out of range:
    `count`) are one `error:` line and exit code 2, as every refusal of a benchmark, before anything loads."""

    def error(self, message: str) -> NoReturn:
        refuse(f"{message} (see {self.prog} --help)")


def count(least: int = 1, most: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= `least` (and <= `most`), else refused naming the flag and the value
    (`--passages 0` ended in a ZeroDivisionError deep in a cell)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < least or (most is not None and value > most):
            allowed = f">= {least}" if most is None else f"in {least}..{most}"
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value}")
        return value

    return parse


def smollm2(dtype: str | torch.dtype = "float32", attn_implementation: str = "sdpa"):
    """(SmolLM2-135M-Instruct in eval mode, its tokenizer): the embedded GGUF file, de-quantized (cached)."""
    model = hp.load_model("smollm2", dtype=getattr(torch, dtype_name(dtype)), attn_implementation=attn_implementation)
    return model.eval(), hp.load_tokenizer("smollm2")


def minilm():
    """(all-MiniLM-L6-v2 in eval mode, its tokenizer), or None when its asset package is not installed."""
    try:
        assets.minilm_dir()
    except FileNotFoundError:
        return None
    return hp.load_model("minilm").eval(), hp.load_tokenizer("minilm")


def text(tokenizer, n: int, play: str = "hamlet") -> tuple[list[int], str]:
    """(the first n tokens of `play`, no special tokens; "play"), or of the plays joined, longest first, when
    `play` alone has fewer than n tokens (their names joined by " + ")."""
    ids = tokenizer(assets.shakespeare_text(play), add_special_tokens=False)["input_ids"]
    if len(ids) >= n:
        return ids[:n], play
    names, texts = [], []
    for name in sorted(assets.shakespeare_plays(), key=lambda name: -len(assets.shakespeare_text(name))):
        names.append(name)
        texts.append(assets.shakespeare_text(name))
        ids = tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"]
        if len(ids) >= n:
            return ids[:n], " + ".join(names)
    refuse(f"all of Shakespeare is {len(ids)} tokens, fewer than {n}")


def plays(tokenizer, names: Sequence[str], n: int) -> dict[str, list[int]]:
    """{play: its first n tokens}, each play on its own (no special tokens); a play shorter than n is refused."""
    available = assets.shakespeare_plays()
    unknown = sorted(set(names) - set(available))
    if unknown:
        refuse(f"no play {', '.join(unknown)}; the plays: {', '.join(available)}")
    docs = {}
    for play in names:
        ids = tokenizer(assets.shakespeare_text(play), add_special_tokens=False)["input_ids"]
        if len(ids) < n:
            refuse(f"{play} has {len(ids)} tokens, fewer than {n}")
        docs[play] = ids[:n]
    return docs


def corpus_ids(tokenizer, spec: str) -> list[int]:
    """The token ids of a load_corpus spec's documents joined by newlines, in order (no special tokens): the
    held-out text of bench_recall and bench_short_to_long (`kjv`: Genesis on)."""
    return tokenizer("\n".join(corpora.load_corpus(spec)["text"]), add_special_tokens=False)["input_ids"]


def refuse(message: str) -> NoReturn:
    """End a benchmark the way the CLI ends a refusal: one `error: ...` line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run(main: Callable[[], object]) -> object:
    """A benchmark's entry point: hf_posenc's errors (an unknown method, a folder that holds no model, a
    position scheme that does not parse, ...) and the front ends' checks it calls (`user_input.UsageError`: an
    output folder that is a file, ...) end it as `refuse` does, not in a traceback; the cells saved before stay
    saved. Any other exception is a bug, and raises."""
    from hf_posenc.errors import PosEncError, one_line
    from hf_posenc.user_input import UsageError

    try:
        return main()
    except (PosEncError, UsageError) as err:
        refuse(one_line(err))


def results_file(path: str | Path, settings: dict, sections: Sequence[str]) -> tuple[dict, Callable[[], None]]:
    """(results, save) for a benchmark that resumes: the results at `path` (or {"settings": settings, section:
    {} for each section} when there are none yet); save() rewrites the file (after every step, so a rerun goes
    on where this one stopped). Two runs may share the file (different rows of one benchmark on two cores):
    save() first takes, under a lock, the cells another run saved since.

    Results taken with other settings are refused (exit 2), never overwritten: at the start, and at every save,
    since a run that started on the same new file may have saved first. So are a file that is not a results file
    (not JSON, not an object of sections) and a path that cannot hold one; the file is left as it was. Settings
    are JSON values (a tuple is kept as the list JSON reads back); a NaN or infinite number is refused by name."""
    path = Path(path)
    settings = json_settings(settings)
    if path.is_dir():
        refuse(f"--out {path} is a folder; give the path of a .json results file")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                refuse(f"--out {path}: {parent} is a file, not a folder")
            break
    results = {"settings": settings, **{section: {} for section in sections}}
    if path.exists():
        saved = read_results(path, sections)
        check_settings(path, settings, saved["settings"], "holds results taken with",
                       "give this run another --out, or delete that file to start over")
        results = saved
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        refuse(f"--out {path}: cannot make its folder ({e.strerror or e})")

    def save() -> None:
        try:
            with open(path.with_name(f".{path.name}.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if path.exists():
                    current = read_results(path, sections)
                    check_settings(path, settings, current["settings"], "was saved meanwhile by a run with",
                                   "this run's cells are not saved there; give it another --out (its rerun "
                                   "goes on from there)")
                    for section in sections:   # in place: callers may hold a section's dict
                        for key, cell in current[section].items():
                            results[section].setdefault(key, cell)
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(json.dumps(results, indent=1))
                os.replace(tmp, path)
        except OSError as e:
            refuse(f"--out {path}: cannot write it ({e.strerror or e})")

    return results, save


def json_settings(settings: dict) -> dict:
    """`settings` as the results file will read back (tuples become lists); a value JSON cannot hold, or a
    NaN or infinite number (which would never equal itself on a rerun), is refused by its key."""
    for key, value in settings.items():
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            refuse(f"setting {key} is {value!r}: a results file's settings are finite numbers")
        except TypeError:
            refuse(f"setting {key} is {value!r}, a {type(value).__name__}: a results file's settings are JSON "
                   f"values (numbers, strings, booleans, None, lists and objects of them)")
    return json.loads(json.dumps(settings))


def read_results(path: Path, sections: Sequence[str]) -> dict:
    """The results file at `path`, checked: a JSON object whose settings and sections are objects (a section it
    lacks is added, empty); anything else is refused, the file untouched."""
    what = "give this run another --out, or delete that file to start over"
    try:
        saved = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        refuse(f"--out {path}: cannot read it ({e.strerror or e})")
    except UnicodeDecodeError:
        refuse(f"{path} is not a results file (not UTF-8 text): {what}")
    except json.JSONDecodeError as e:
        refuse(f"{path} is not a results file ({'empty' if not path.stat().st_size else f'not JSON: {e}'}): {what}")
    if not isinstance(saved, dict):
        refuse(f"{path} is not a results file (a JSON {json_kind(saved)}, not an object of sections): {what}")
    for key in ("settings", *sections):
        if not isinstance(saved.setdefault(key, {}), dict):
            refuse(f"{path} is not a results file (its {key!r} is a {json_kind(saved[key])}, not an object): {what}")
    return saved


def json_kind(value: Any) -> str:
    """What JSON calls the value's kind: "list", "number", "string", ..."""
    kinds = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return kinds.get(type(value), "null")


def check_settings(path: Path, settings: dict, theirs: dict, verb: str, hint: str) -> None:
    """Refuse (exit 2) when the file's settings differ from this run's, naming each differing key and both values."""
    def shown(values: dict, key: str) -> str:
        return repr(values[key]) if key in values else "absent"

    def same(key: str) -> bool:  # as JSON: True and 1, 1 and 1.0 are different settings
        return key in settings and key in theirs and json.dumps(settings[key]) == json.dumps(theirs[key])

    changed = sorted(k for k in {*settings, *theirs} if not same(k))
    if changed:
        differ = "; ".join(f"{k} {shown(theirs, k)} there, {shown(settings, k)} here" for k in changed)
        refuse(f"{path} {verb} other settings ({differ}): {hint}")


class Timing(NamedTuple):
    value: Any  # what the timed call returned
    wall: float  # seconds, time.perf_counter
    cpu: float  # seconds of this process's CPU time, time.process_time


def timed(fn: Callable[[], Any]) -> Timing:
    """Run fn once: its result, its wall-clock and its process CPU time."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return Timing(value, time.perf_counter() - wall, time.process_time() - cpu)


def peak_step(fn: Callable[[], Any], cuda: bool) -> tuple[float, float, float]:
    """(wall seconds, peak MiB above what was resident before, resident MiB before) of one call of fn (a
    training step). On a GPU `torch.cuda.max_memory_allocated`; on a CPU the peak resident set (VmHWM, reset to
    the current RSS through /proc/self/clear_refs), which counts freed heap fragments unless glibc's mmap
    threshold is fixed (MALLOC_MMAP_THRESHOLD_=131072, as bench_train_memory.py explains)."""
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _status_mib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
    started = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _status_mib("VmHWM")
    return seconds, peak - base, base


def _status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def interleaved(fa: Callable, fb: Callable, repeats: int, warmup: int = 1) -> tuple[list[Timing], list[Timing]]:
    """`repeats` timings of fa and of fb, alternating which runs first in each round (a,b then b,a, ...), so
    a drifting load on shared cores weighs on both alike; after `warmup` untimed calls of each. What the calls
    return is dropped (a forward's logits, kept for every repeat, would hold gigabytes)."""
    for _ in range(warmup):
        fa()
        fb()
    ta, tb = [], []
    for i in range(repeats):
        for fn, times in ((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta)):
            times.append(timed(fn)._replace(value=None))
    return ta, tb


def rotated(names: Sequence, round_: int) -> list:
    """The order of round `round_` when several things are timed round-robin: each starts a round in turn."""
    k = round_ % len(names)
    return [*names[k:], *names[:k]]


def median(timings: Sequence[Timing], clock: str = "wall") -> float:
    """The median of the timings' wall ("wall") or process CPU ("cpu") seconds."""
    return statistics.median(getattr(t, clock) for t in timings)


def machine() -> str:
    """The line a result is reported with: date, CPU, torch's CPU capability, whether bfloat16 runs natively,
    cores and torch threads, load average, torch and transformers versions."""
    native, _ = _compat.native_bfloat16("cpu")
    device = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{datetime.date.today()}, {platform.machine()} {cpu_name()}, cpu capability {torch.backends.cpu.get_cpu_capability()}, bfloat16 "
            f"{'native' if native else 'emulated'}{device}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
            f"threads, load average {os.getloadavg()[0]:.1f}, Python {platform.python_version()}, torch "
            f"{torch.__version__}, transformers {transformers.__version__}")


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "(CPU model unknown)"
