"""`FactorSearch`: the candidates scored one by one (the guard inside the original context, then the long pass's
far-recall loss), the closed-form seeds first, then CMA-ES (Hansen 2016, the `cmaes` package) from the best of
them; every candidate appended as it completes, so a killed search replays to where it stopped. Also the time
left and the convergence figure."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import api
from ..errors import ConfigError, InvalidInputError
from ..eval import recall, stats
from ..eval.perplexity import as_token_ids, pass_progress, token_nll
from ..export.serving import whole_file
from ..record_reader import read_record
from .factors import SEED_NAMES, closed_forms, critical_pair, longrope_params, rotary_module
from .record import (SearchSettings, append_candidate, candidate_identity, keep_finished, only_search, read_candidates,
                     resume_record, text_identity, weights_identity, write_whole)

REJECTED = 1000.0   # what a rejected candidate scores, plus how far it missed: below every accepted one


class FactorSearch:
    """A factor search for `model` at `settings.target`, recorded in `out` (search.json, candidates.jsonl)."""

    def __init__(self, model: torch.nn.Module, tokenizer, text_ids: Sequence[int], settings: SearchSettings,
                 out: str | os.PathLike, *, prefix: Sequence[int] = (), progress: bool = True,
                 sets: list[recall.RecallSet] | None = None):
        if not isinstance(settings, SearchSettings):
            raise InvalidInputError(f"settings must be a SearchSettings (hf_posenc.search), got "
                                    f"{type(settings).__name__}")
        as_token_ids(text_ids, "text_ids")   # a string or floats refused, naming the argument
        if Path(out).exists() and not Path(out).is_dir():
            raise InvalidInputError(f"out {out} is a file: a search writes a folder (search.json, candidates.jsonl)")
        rotary = rotary_module(model)
        record = read_record(model.config)
        if record is not None:
            raise InvalidInputError(f"the model is already patched ({record.method}): search from the unpatched model")
        known = model.config.get_text_config().max_position_embeddings
        if settings.original != known:
            raise InvalidInputError(f"settings.original {settings.original} is not the model's original context "
                                    f"{known}: the factors would be searched for another model")
        self.model, self.settings, self.out, self.progress = model, settings, Path(out), progress
        self.pairs = int(rotary.inv_freq.numel())
        self.critical = critical_pair(rotary.inv_freq, settings.original)
        self.space = settings.space(self.pairs, self.critical)
        s = settings
        self.sets = sets if sets is not None else s.recall_sets(tokenizer, text_ids, prefix)   # `sets`: built before
        layout = self.sets[0].layout
        guard = list(prefix) + [int(t) for t in text_ids[:s.guard_length - len(prefix)]]
        self.guard_ids = torch.tensor([guard])
        self.record = {"settings": asdict(s), "pairs": self.pairs,
                       "identity": {"text": text_identity(list(prefix) + [int(t) for t in text_ids]),
                                    "weights": weights_identity(model)},
                       "passages": [{"sequence": r.index, "text_starts": r.passages} for r in self.sets],
                       "firsts": list(layout.firsts), "repeats": list(layout.repeats), "critical_pair": self.critical}
        self.identity = candidate_identity(self.record, self.out / "search.json")   # on every line it writes
        self._guards: dict[str, float] = {}

    # -- measuring -------------------------------------------------------------------------------------
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def guard_perplexity(self) -> float:
        nll = token_nll(self.model, self.guard_ids.to(self._device()))
        return float(torch.exp(nll.double().mean()))

    def _score(self, sets: Sequence[recall.RecallSet]) -> list[dict]:
        bar = pass_progress(self.model, "candidate", self.settings.original) if self.progress else \
            contextlib.nullcontext()
        with bar:   # a 32k pass: minutes on a CPU, a bar of its own
            rows = recall.score_recall(self.model, sets, control=False, progress=False)
        return [r for r in rows if r["distance"] >= self.settings.far]

    def weights(self, distances: Sequence[int]) -> np.ndarray:
        """Each passage's weight in the fitness, mean 1: every band weighs alike, however many passages it holds."""
        bands = self.settings.bands
        index = np.array([min(len(bands) - 1, sum(d >= a for a, _ in bands[1:])) for d in distances])
        counts = np.bincount(index, minlength=len(bands))
        present = int((counts > 0).sum())
        return len(distances) / (present * counts[index])

    def fitness(self, incumbent: dict | None = None) -> dict:
        """The repeats' loss of the passages at least `far` back, every band weighing alike (mean, interval, n), with
        each passage's loss and each band's mean. Racing against `incumbent` (the best fully scored candidate): the
        first sequence alone, and the rest only when its paired difference from the incumbent on the same passages
        does not already show it worse (the interval's lower end above 0)."""
        race = self.settings.race and incumbent is not None
        rows = self._score(self.sets[:1] if race else self.sets)
        raced_out, d = False, None
        if race:
            m = len(rows)
            w = self.weights([r["distance"] for r in rows])
            mine = np.array([r["loss_with"] for r in rows]) * w
            d = stats.paired_difference(mine.tolist(), (np.array(incumbent["losses"][:m]) * w).tolist())
            raced_out = bool(d["low"] > 0)
            if not raced_out:
                rows += self._score(self.sets[1:])
        losses = [r["loss_with"] for r in rows]
        weighted = np.array(losses) * self.weights([r["distance"] for r in rows])
        summary = stats.bootstrap_mean(weighted.tolist())
        gap = stats.bootstrap_mean([r["gap"] for r in rows])
        bands = []
        for a, b in self.settings.bands:
            inside = [r["loss_with"] for r in rows if a <= r["distance"] < b]
            bands.append({"from": a, "to": b, "n": len(inside),
                          "loss": round(float(np.mean(inside)), 5) if inside else None})
        out = {"loss": summary["mean"], "low": summary["low"], "high": summary["high"], "n": summary["n"],
               "gap_one_pass": gap["mean"], "losses": [round(v, 5) for v in losses],
               "distances": [r["distance"] for r in rows], "bands": bands, "raced_out": raced_out}
        if raced_out:   # ranked where its paired gap puts it: behind the incumbent by what the first sequence showed
            out["sequences_scored"] = 1
            out["estimate"] = incumbent["value"] + d["mean"]
        return out

    def evaluate(self, index: int, kind: str, factors: list[float], attention: float | None,
                 x: Sequence[float] | None, reference: float, incumbent: dict | None = None) -> dict:
        s = self.settings
        params = longrope_params(factors, attention, s.mode, s.target)
        start, cpu = time.perf_counter(), time.process_time()
        row = {"index": index, "kind": kind, "x": None if x is None else [float(v) for v in x],
               "long_factor": factors, "attention_factor": attention, "mode": s.mode}
        with api.patched(self.model, "longrope", **params):
            key = json.dumps([params["short_factor"], attention])
            if key not in self._guards:   # the guard's length sees only the short factors and the attention factor
                self._guards[key] = self.guard_perplexity()
            guard = self._guards[key]
            rise = guard / reference - 1
            row |= {"guard_perplexity": guard, "guard_rise": rise}
            if rise > s.guard_share:
                row |= {"rejected": True, "value": REJECTED + rise, "loss": None}
            else:
                row |= {"rejected": False, **self.fitness(incumbent)}
                row["value"] = row.pop("estimate", row["loss"])
        row["seconds"] = round(time.perf_counter() - start, 2)
        row["cpu_seconds"] = round(time.process_time() - cpu, 2)   # all threads of this process: the CPU cost
        return row

    def _check_constant_guard(self, factors: list[float], reference: float) -> None:
        """Switched, with the attention factor not searched, every candidate is the same model inside the original
        context: a guard it fails fails them all, refused before the first long pass."""
        s = self.settings
        if s.mode != "switched" or self.space.attention_range is not None:
            return
        with api.patched(self.model, "longrope", **longrope_params(factors, None, s.mode, s.target)) as model:
            rise = self.guard_perplexity() / reference - 1
            scale = float(rotary_module(model).attention_scaling)
        if rise > s.guard_share:
            raise ConfigError(
                f"every candidate of a switched search with the attention factor not searched is the unpatched model "
                f"inside the original context but for longrope's default attention factor {scale:.4g}, which raises "
                f"the guard's perplexity by {rise:.2%} (guard_share {s.guard_share:.1%}): search it "
                f"(attention_range [1.0, 1.1]) or allow more (guard_share)")

    # -- the loop --------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Seeds, then CMA-ES for `budget` candidates, each appended to candidates.jsonl as it completes; a rerun
        goes on after the last one written (with a larger budget: further). Returns the best accepted candidate; a
        search whose every candidate was rejected is refused."""
        try:
            from cmaes import CMA
        except ImportError:
            raise ConfigError("the factor search needs the cmaes package: pip install 'hf_posenc[search]'") from None
        with only_search(self.out):
            return self._run(CMA)

    def _saved(self, settings_path: Path) -> dict | None:
        """The saved search's record, once its settings, identity (text and weights) and passages are checked to be
        this run's (a resume); None for a new search."""
        if not settings_path.exists():
            return None
        saved = resume_record(settings_path, self.record["settings"])
        for what, why in (("text", "the tuning text's token ids (the corpus or the tokenizer changed)"),
                          ("weights", "the model's weights (another checkpoint, or the same one changed)")):
            there = saved["identity"][what]
            if there != self.record["identity"][what]:
                raise ConfigError(f"{settings_path} holds a search of other {what}: {why} differ from the "
                                  f"ones it scored (sha256 {there[:12]} there, {self.record['identity'][what][:12]}"
                                  f" now); resume with them, or name another output folder")
        if saved.get("passages") != self.record["passages"]:
            raise ConfigError(f"{settings_path} used other passages of the text (a changed corpus or "
                              f"tokenizer); name another output folder")
        return saved

    def _reference(self, settings_path: Path) -> float:
        """The unpatched model's guard perplexity, measured now and written with the settings (a new search)."""
        reference = self.guard_perplexity()
        if not math.isfinite(reference) or reference <= 0:
            raise InvalidInputError(f"the unpatched model's guard perplexity is {reference} on the first "
                                    f"{self.settings.guard_length} tokens: no candidate can be measured against "
                                    f"it (a model whose outputs are not finite in {self.settings.dtype}?)")
        self.record |= {"unpatched_guard_perplexity": reference, "started": time.strftime("%Y-%m-%d %H:%M")}
        write_whole(settings_path, json.dumps(self.record, indent=1))
        return reference

    def _run(self, CMA) -> dict:
        path = self.out / "candidates.jsonl"
        saved = self._saved(self.out / "search.json")
        done = read_candidates(path, self.record)   # each line this search's, or refused before anything is written
        reference = saved["unpatched_guard_perplexity"] if saved else self._reference(self.out / "search.json")
        keep_finished(path, done)
        seeds = closed_forms(self.model, self.settings.target)
        self._check_constant_guard(seeds[0][1], reference)
        total = len(seeds) + self.settings.budget
        # no tqdm estimate: it would average the guard's rejections (seconds) with the long passes (minutes)
        bar = tqdm(total=total, initial=min(len(done), total), desc="factor search", unit="candidate",
                   disable=not self.progress, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
        rows = list(done)

        def take(index: int, kind: str, factors, attention, x) -> dict:
            if index < len(done):
                old = done[index]
                same = old["kind"] == kind and np.allclose(old["long_factor"], factors, rtol=1e-5) and (
                    x is None or np.allclose(old["x"], x, atol=1e-9))
                if not same:
                    raise ConfigError(f"{path}: candidate {index} was {old['kind']}, this run asks {kind} with other "
                                      f"factors: the file was edited, or the search does not replay (another cmaes "
                                      f"version); name another output folder")
                return old
            scored = [r for r in rows if not r["rejected"] and not r.get("raced_out")]
            incumbent = min(scored, key=lambda r: r["value"], default=None)
            row = self.evaluate(index, kind, factors, attention, x, reference, incumbent) | {"identity": self.identity}
            append_candidate(path, row)
            rows.append(row)
            bar.update()
            best = min((r for r in rows if not r["rejected"]), key=lambda r: r["value"], default=None)
            left = time_left(rows, total)
            bar.set_postfix_str((f"best {best['loss']:.4f} ({best['kind']})" if best else "all rejected") +
                                (f", ~{left / 60:.0f} min left" if left is not None else ""))
            return row

        space = self.space
        for k, (name, factors, attention) in enumerate(seeds):
            if space.attention_range is None:
                attention = None
            else:
                attention = float(np.clip(attention, *space.attention_range))
            take(k, f"seed:{SEED_NAMES[name]}", factors, attention, None)
        start = min(rows[:len(seeds)], key=lambda r: r["value"])
        x0 = space.fit(start["long_factor"], start["attention_factor"])
        cma = CMA(mean=x0, sigma=self.settings.sigma, bounds=np.array([[0.0, 1.0]] * space.dims),
                  seed=self.settings.seed, population_size=self.settings.population or None)
        index = len(seeds)
        while index < total:
            generation = []
            for _ in range(cma.population_size):
                if index >= total:
                    break
                x = cma.ask()
                factors, attention = space.point(x)
                row = take(index, f"cma:{index - len(seeds) + 1}", factors, attention, x)
                generation.append((x, row["value"]))
                index += 1
            if len(generation) == cma.population_size:
                cma.tell(generation)
        bar.close()
        accepted = [r for r in rows if not r["rejected"] and not r.get("raced_out")]
        if not accepted:
            raise InvalidInputError(f"every candidate of {path} was rejected by the guard (perplexity at "
                                    f"{self.settings.guard_length} rose by more than {self.settings.guard_share:.1%}): "
                                    f"widen guard_share or the attention range")
        return min(accepted, key=lambda r: r["value"])


def time_left(rows: Sequence[dict], total: int) -> float | None:
    """Seconds the candidates still to run should take: each a long pass at the median long pass's time, or a
    guard's rejection at the median rejection's, in the shares seen so far (None before any long pass)."""
    passes = [r["seconds"] for r in rows if not r["rejected"] and "seconds" in r]
    if not passes:
        return None
    if len(rows) >= total:
        return 0.0
    rejected = [r["seconds"] for r in rows if r["rejected"] and "seconds" in r]
    share = len(passes) / (len(passes) + len(rejected))
    cost = share * float(np.median(passes)) + (1 - share) * (float(np.median(rejected)) if rejected else 0.0)
    return (total - len(rows)) * cost


def convergence_figure(rows: Sequence[dict], path: str | os.PathLike, title: str = "") -> None:
    """Each candidate's loss (rejected ones marked above them all) and the best so far, against candidates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    accepted = [(r["index"], r["loss"]) for r in rows if not r["rejected"]]
    best, running = math.inf, []
    for r in rows:
        if not r["rejected"] and not r.get("raced_out"):
            best = min(best, r["loss"])
        running.append(best)
    whole = [(r["index"], r["loss"]) for r in rows if not r["rejected"] and not r.get("raced_out")]
    raced = [(r["index"], r["loss"]) for r in rows if not r["rejected"] and r.get("raced_out")]
    if whole:
        ax.scatter(*zip(*whole), s=14, color="tab:blue", label="candidate (CMA-ES)")
    if raced:
        ax.scatter(*zip(*raced), s=16, facecolors="none", edgecolors="tab:orange",
                   label="raced out: its first sequence's loss")
    top = max((v for _, v in accepted), default=1.0) * 1.08
    seeds = [r for r in rows if r["kind"].startswith("seed:")]
    for r in seeds:
        y = top if r["rejected"] else r["loss"]
        ax.scatter([r["index"]], [y], s=44, facecolors="none", edgecolors="tab:green")
        ax.annotate(r["kind"][5:], (r["index"], y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    if seeds:
        ax.scatter([], [], s=44, facecolors="none", edgecolors="tab:green", label="seed (closed form)")
    finite = [(i, v) for i, v in enumerate(running) if math.isfinite(v)]
    if finite:
        ax.step(*zip(*finite), where="post", color="tab:red", label="best so far")
    rejected = [r["index"] for r in rows if r["rejected"]]
    if rejected:
        ax.scatter(rejected, [top] * len(rejected), marker="x", color="grey", label="rejected by the guard (top row)")
    ax.set_xlabel("candidate")
    ax.set_ylabel("loss of far repeats (nats / token, lower is better)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))   # outside: no point hidden
    fig.tight_layout()
    with whole_file(Path(path)) as tmp:   # a kill leaves the old figure or none
        fig.savefig(tmp, dpi=110, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
