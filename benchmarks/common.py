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
from typing import Any, NamedTuple

import torch
import transformers

import hf_posenc as hp
from hf_posenc import _compat, assets
from hf_posenc.loading import resolve_dtype


def dtype_name(dtype: str | torch.dtype | None) -> str:
    """"float32", "bfloat16", ...; None or "auto": bfloat16 where the hardware runs it natively, else float32."""
    if dtype is None or dtype == "auto":
        dtype = resolve_dtype("auto")[0]
    return str(dtype).removeprefix("torch.")


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
    raise SystemExit(f"all of Shakespeare is {len(ids)} tokens, fewer than {n}")


def plays(tokenizer, names: Sequence[str], n: int) -> dict[str, list[int]]:
    """{play: its first n tokens}, each play on its own (no special tokens); a play shorter than n is refused."""
    available = assets.shakespeare_plays()
    unknown = sorted(set(names) - set(available))
    if unknown:
        raise SystemExit(f"error: no play {', '.join(unknown)}; the plays: {', '.join(available)}")
    docs = {}
    for play in names:
        ids = tokenizer(assets.shakespeare_text(play), add_special_tokens=False)["input_ids"]
        if len(ids) < n:
            raise SystemExit(f"error: {play} has {len(ids)} tokens, fewer than {n}")
        docs[play] = ids[:n]
    return docs


def results_file(path: str | Path, settings: dict, sections: Sequence[str]) -> tuple[dict, Callable[[], None]]:
    """(results, save) for a benchmark that resumes: the results at `path` (or {"settings": settings, section:
    {} for each section} when there are none yet); save() rewrites the file (after every step, so a rerun goes
    on where this one stopped). Two runs may share the file (different rows of one benchmark on two cores):
    save() first takes, under a lock, the cells another run saved since. Results taken with other settings
    are refused (exit 2), never overwritten: they belong in another file."""
    path = Path(path)
    results = {"settings": settings, **{section: {} for section in sections}}
    if path.exists():
        saved = json.loads(path.read_text())
        theirs = saved.get("settings", {})
        changed = sorted(k for k in {*settings, *theirs} if settings.get(k) != theirs.get(k))
        if changed:
            print(f"error: {path} holds results taken with other settings ({', '.join(changed)}): give these "
                  f"another --out, or delete that file to start over", file=sys.stderr)
            raise SystemExit(2)
        results = saved
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        with open(path.with_name(f".{path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = json.loads(path.read_text()) if path.exists() else {}
            if current.get("settings") == settings:
                for section in sections:   # in place: callers may hold a section's dict
                    for key, cell in current.get(section, {}).items():
                        results[section].setdefault(key, cell)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(results, indent=1))
            os.replace(tmp, path)

    return results, save


class Timing(NamedTuple):
    value: Any  # what the timed call returned
    wall: float  # seconds, time.perf_counter
    cpu: float  # seconds of this process's CPU time, time.process_time


def timed(fn: Callable[[], Any]) -> Timing:
    """Run fn once: its result, its wall-clock and its process CPU time."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return Timing(value, time.perf_counter() - wall, time.process_time() - cpu)


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
