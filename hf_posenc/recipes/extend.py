"""Extend a RoPE checkpoint's context in one command: plan, factor search, fine-tune, short stage, judge, export.

    hf-posenc extend --model smollm2 --target 32768                 # SmolLM2-135M, 8k -> 32k
    hf-posenc extend --model Qwen/Qwen2.5-0.5B --target 65536 --hours 6
    hf-posenc extend --config extend_smollm2 --target 16384 --judge.mode quick
    hf-posenc extend --model smollm2 --target 32768 --plan_only    # the plan, nothing run
    hf-posenc extend --help                                         # every field, its default and what it does

Every setting follows from the model's config, the target and the machine by a rule (`plan`: each printed with
its reason before any weights load, each overridable with its flag): the critical rotary pair and its floor, the
search's distance bands and passages, the fine-tune's window, PoSE's span, its tokens and steps (from --tokens, or
from --hours and this machine's measured rates). The stages run in order, each in a subfolder of output_dir:

    search/     the factor search (hf_posenc/recipes/search.py); search/best is the untrained start
    finetune/   the fine-tune from it (hf_posenc/recipes/finetune_recipe.py)
    short/      a short second stage: contiguous windows inside the original context, cross-entropy, which takes
                back the perplexity the fine-tune costs there (train.short_steps 0: none)
    judge/      recall at a distance against the untrained start, YaRN and Self-Extend at the target, on a text
                neither stage read; perplexity at the original length and the target; the passkey far back
    (root)      the extended checkpoint, its model card (README.md) and REPORT.md with the figures

A killed run resumes at its stage (the search and the fine-tune resume inside theirs); a rerun with other settings
is refused naming each, but for the judge's (those judge the same checkpoint again); an output_dir that holds
anything but this run is refused. A model with one RoPE per layer type (Gemma 3) skips the search (it takes one
RoPE) and starts the fine-tune from YaRN, the plan says so.
The two-config path (hf-posenc search, then hf-posenc finetune) is this pipeline's first two stages by hand."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from hf_posenc import user_input
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import extend_report, recipe_config
from hf_posenc.recipes.extend_config import ExtendConfig, parse_args
from hf_posenc.recipes.extend_report import format_value, write_json

STAGES = ("search", "finetune", "short", "judge", "export")
TRAINED = ("search", "finetune", "short")   # the stages a rerun with other judge settings keeps
ADJUSTABLE = ("judge.",)   # settings a rerun may change: the same checkpoint judged again
PLANNED_BEFORE = {"train.short_long_share": 0.0}   # settings added since a run was planned: the value it ran with
TEXT_FIELDS = ("search.corpus", "train.corpus", "judge.corpus")   # the texts the stages read
CLOCK_SECONDS = 30.0   # a running stage writes down its time this often (clock.json; REPORT.md says half a minute)
TEXTS = ("kjv", "shakespeare", "stdlib")   # the built-in corpora: the judge takes the first no stage read


# ------------------------------------------------------------------------------------------------- the plan
@dataclass
class Setting:
    """One planned value, why it is what it is, and whether the user set it."""
    name: str
    value: object
    reason: str
    given: bool = False


@dataclass
class Facts:
    """What the plan reads of the model, from its config alone (no weights)."""
    ref: str
    name: str                   # its hub id, else its folder's name: what the plan, the records and the card show
    model_type: str
    original: int
    pairs: int
    critical: int | None     # None: one RoPE per layer type (no search)
    parameters: int
    attention: int              # layers x query heads x head size: what a pass's attention part grows with
    layer_types: list
    apart: str | None = None  # why documents cannot be kept apart under spread ids (None: they can)
    baselines: dict = field(default_factory=dict)   # training-free method -> None (it applies) or why not
    passes: str = "sdpa"        # the judge's passes (and an "auto" search's): eager where the class has no sdpa


def model_facts(args: ExtendConfig) -> Facts:
    """The model's config checked for what extending takes (a causal LM with plain RoPE, not patched, not scaled)."""
    from hf_posenc import _compat
    from hf_posenc.recipes.patch_card import base_name
    from hf_posenc.record_reader import read_record
    from hf_posenc.search import critical_pair

    ref = user_input.model_ref(args.model.name)
    skeleton = user_input.model_skeleton(ref, methods=["yarn"], causal_lm_for="hf-posenc extend")   # RoPE, causal
    config = skeleton.config
    text = config.get_text_config()
    record = read_record(config)
    if record is not None:
        raise ConfigError(f"model {args.model.name} is already patched ({record.method}): extend the model it was "
                          f"patched from")
    layers = _compat.rope_layer_types(text)
    for layer in layers:
        rope_type = _compat.get_rope_parameters(text, layer).get("rope_type", "default")
        if rope_type != "default":
            raise ConfigError(f"model {args.model.name} already ships rope_type={rope_type!r} scaling"
                              f"{f' ({layer})' if layer else ''}: extend its checkpoint before that scaling")
    original = int(text.max_position_embeddings)
    if args.target <= original:
        raise ConfigError(f"--target {args.target} must be longer than the model's original context {original}: "
                          f"there is nothing to extend")
    rotary = next(m for m in skeleton.modules() if _compat.is_rotary_module(m))
    inv_freq, _ = _compat.rope_init(text, layers[0], None, type(rotary), device="cpu")
    critical = critical_pair(inv_freq, original) if layers == [None] else None
    parameters = sum(p.numel() for p in skeleton.parameters())
    heads = text.num_attention_heads
    attention = text.num_hidden_layers * heads * (getattr(text, "head_dim", None) or text.hidden_size // heads)
    from hf_posenc.recipes.finetune_checks import check_attention
    from hf_posenc.train.documents import why_not_per_document
    from hf_posenc.train.hardware import choose_attention

    check_attention(args.model, skeleton)   # an implementation transformers refuses: now, not after plan.json
    apart = why_not_per_document(config, choose_attention(args.model.attn_implementation, config))
    baselines = {name: applies(skeleton, name, args.target) for name in BASELINES}
    del skeleton
    return Facts(ref, base_name(args.model.name), config.model_type, original, len(inv_freq), critical, parameters,
                 attention, layers, apart, baselines, choose_attention("auto", config, flash=False))


BASELINES = ("yarn", "self_extend")   # the training-free methods the report card compares with


def applies(skeleton, method: str, target: int) -> str | None:
    """None where `method` patches the model at `target` (planned on its skeleton, nothing changes), else why not."""
    from hf_posenc import eval as hpe
    from hf_posenc.errors import PosEncError
    from hf_posenc.registry import get_method, plan_patch

    try:
        params = hpe.variant_params(skeleton, method, {}, target)
        plan_patch(skeleton, get_method(method)(**params))
    except (PosEncError, ValueError) as err:
        return str(err).split(";")[0]
    return None


def machine_kind(dtype: str = "auto") -> tuple[str, str, str, str]:
    """(kind, words, dtype, why) of this machine: the kind for the rates below (a GPU, or the CPU's bfloat16
    support), and the dtype `dtype` resolves to here."""
    import torch

    from hf_posenc import _compat, loading

    dtype, why = loading.resolve_dtype(dtype)
    dtype = str(dtype).removeprefix("torch.")
    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name(0), dtype, why
    native = _compat.native_bfloat16("cpu")[0]
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    kind = "amx" if native and amx else "avx512_bf16" if native else "float32"
    return (kind, f"{os.cpu_count()} CPU cores, torch capability {torch.backends.cpu.get_cpu_capability()}"
                  f"{', AMX' if amx else ''}", dtype, why)


class Rate(NamedTuple):
    """SmolLM2-135M on one kind of machine (benchmarks/RESULTS.md, the summary's cost row): seconds a search candidate
    takes at 32k (the raced, banded search: two passes at the target, one where the race drops it after its first
    sequence, none where the guard rejects it: ~1.4 passes on average), training tokens a second at 4096-token
    windows, and seconds one 32k forward pass takes (the judge's unit: a recall sequence, a passkey trial, a
    perplexity pass)."""
    candidate: float
    tokens_s: float
    forward: float


RATES = {
    # 2 Xeon cores with AMX: 21 candidates in 21.9 min; 201 tokens/s; a 32k bfloat16 forward 81.7 s
    "amx": Rate(62.0, 201.0, 81.7),
    # 2 EPYC cores, AVX512-BF16 without AMX: x1.67 a 32k forward (136.7 s), x2.34 a step
    "avx512_bf16": Rate(104.0, 86.0, 136.7),
    # 2 AVX2 cores, float32 (machine B): the 16k search's 21 candidates, median 133 s, mean 146 s without the two
    # that ran 1022 and 2847 s beside other work (169 s by this rule); a 4096-token step 86 s at 16k (52 tokens/s,
    # 8.9 GB); a forward ~120 s at 16k, 6-7 min at 32k
    "float32": Rate(550.0, 52.0, 390.0),
    # one H200 (bf16, sdpa): 27,010 tokens/s in the recipe's log; a 32k recall cell (two passes) ~1 s on an H100
    "cuda": Rate(2.0, 27000.0, 0.5),
}
REFERENCE_PARAMETERS = 135e6
REFERENCE_ATTENTION = 30 * 9 * 64   # SmolLM2-135M: layers x query heads x head size


def token_seconds(facts: Facts, machine: tuple) -> float:
    """Seconds a fine-tune token takes on this machine: RATES' tokens a second, scaled by the parameter count."""
    return facts.parameters / REFERENCE_PARAMETERS / RATES[machine[0]].tokens_s


def pass_cost(facts: Facts, length: int) -> float:
    """A forward pass of this model over `length` tokens, in passes of SmolLM2-135M over 32k. Its weights' part
    grows with the length and the parameter count, attention's with the length's square and the attention width.
    The parts (23 % and 77 % of SmolLM2's 32k pass) fit machine B's float32 passes: ~120 s at 16k, ~390 s at 32k,
    ~250 s at 24k as the 24k search ran; the other machines' are taken alike (not measured there)."""
    r = length / 32768
    return (0.23 * r * facts.parameters / REFERENCE_PARAMETERS
            + 0.77 * r * r * facts.attention / REFERENCE_ATTENTION)


SHORT_STEP_COST = 0.7   # a short-stage step against a fine-tune step (no LongCE pass): 82 against 55 tokens/s on B


@dataclass
class Plan:
    settings: list
    facts: Facts
    machine: tuple

    def value(self, name: str):
        return next(s.value for s in self.settings if s.name == name)

    def rows(self) -> list[str]:
        """The rows of the report card: the extended checkpoint, its untrained start, and the training-free methods
        that apply to the model."""
        return ["extended", *(["start"] if self.value("search") else []), *self.value("judge.rows")]

    def record(self) -> dict:
        """What makes two runs the same run (compared on a rerun; plan.json): local texts by which files they read
        (corpora.text_key: however the path is spelled, from wherever the command runs; no machine path)."""
        from hf_posenc import corpora

        return {s.name: corpora.text_key(s.value) if s.name in TEXT_FIELDS and s.value else s.value
                for s in self.settings}

    def estimates(self) -> dict:
        """Minutes each stage should take on this machine (rough: RATES, scaled by parameters and length; the judge
        by its forward passes)."""
        candidate = candidate_seconds(self.facts, self.machine, self.value("target"))
        candidates = 5 + self.value("search.candidates") if self.value("search") else 0
        per_token = token_seconds(self.facts, self.machine)
        train = self.value("train.steps") * self.value("train.seq_len") * per_token   # what the steps train
        short = self.value("train.short_steps") * short_window(self) * per_token * SHORT_STEP_COST
        judge = sum(self.cell_seconds(row, cell) for row, cell in self.judge_cells())
        search = candidates * candidate
        return {"search": search / 60, "finetune": train / 60, "short": short / 60, "judge": judge / 60, "export": 0.1}

    def judge_cells(self) -> list[tuple[str, str]]:
        """Every (row, cell) the judge measures: the unpatched model's (`base`) and each row's."""
        if self.value("judge.mode") == "skip":
            return []
        return [(row, c) for row in ["base", *self.rows()] for c in extend_report.wanted_cells(self, row)]

    def judge_passes(self) -> tuple[int, int]:
        """The judge's forward passes at the target and at the original context, its cells' (cell_passes)."""
        passes = [extend_report.cell_passes(self, row, cell) for row, cell in self.judge_cells()]
        return sum(p[0] for p in passes), sum(p[1] for p in passes)

    def cell_seconds(self, row: str, cell: str) -> float:
        """What a judge cell should take on this machine: its passes at this machine's rate."""
        at_target, at_original = extend_report.cell_passes(self, row, cell)
        return RATES[self.machine[0]].forward * (at_target * pass_cost(self.facts, self.value("target"))
                                                 + at_original * pass_cost(self.facts, self.facts.original))

    def text(self) -> str:
        width = max(len(s.name) for s in self.settings)
        lines = [f"plan: {self.facts.name} ({self.facts.model_type}, {count_words(self.facts.parameters)} parameters) "
                 f"from {self.facts.original} to {self.value('target')} tokens; machine: {self.machine[1]}"]
        for s in self.settings:
            lines.append(f"  {s.name:<{width}}  {format_value(s.value):<22} {'(given) ' if s.given else ''}{s.reason}")
        est = self.estimates()
        parts = [f"{k} ~{v:.0f} min" for k, v in est.items() if v >= 0.5]
        whole = sum(est.values())
        lines.append("  estimated: " + (", ".join(parts) + "; " if parts else "")
                     + (f"whole ~{whole:.0f} min" if whole >= 0.5 else "whole under a minute")
                     + " (rates: benchmarks/RESULTS.md, scaled)")
        return "\n".join(lines)


def default(section, name: str):
    """A field's default in its config section."""
    field_ = next(f for f in dataclasses.fields(section) if f.name == name)
    return field_.default_factory() if callable(field_.default_factory) else field_.default


def asked(section, name: str):
    """The value the user gave a field (None: he left its default, which the plan then states)."""
    value = getattr(section, name)
    return None if value == default(section, name) else value


SHORT_LONG_SHARE = 0.0   # the short stage's share of long windows
GUARD_SHARE = 0.08   # the shipped 32k search's guard (4x); a static factor set costs more inside L as s grows


def make_plan(args: ExtendConfig, facts: Facts, machine: tuple) -> Plan:
    """Every setting of the run from the model, the target and the machine, by the rules stated beside each."""
    L, T = facts.original, args.target
    settings: list[Setting] = []

    def put(name: str, given, derived, reason: str):
        if given is not None and given != derived:   # the reason is the rule's: say what the rule would give
            reason = f"the rule gives {format_value(derived)}: {reason}"
        settings.append(Setting(name, derived if given is None else given, reason, given is not None))
        return settings[-1].value

    put("target", T, T, f"s = {T / L:g} x the original {L}")
    put("dtype", None, machine[2], machine[3])
    searched = facts.critical is not None
    put("search", None, searched,
        f"critical pair {facts.critical} of {facts.pairs}: pairs from it on never turned a full period in {L} tokens"
        if searched else f"skipped: {facts.model_type} has one RoPE per layer type {facts.layer_types}; the factor "
                         f"search takes one RoPE, so the fine-tune starts from YaRN at the target")
    sa = args.search
    unread = [f"search.{f.name}" for f in dataclasses.fields(sa) if asked(sa, f.name) is not None]
    if not searched and unread:   # accepted and ignored would let the user believe they acted
        raise ConfigError(f"{', '.join(unread)}: {facts.model_type} has one RoPE per layer type, which the pipeline "
                          f"does not search (its fine-tune starts from YaRN): drop the search settings")
    if searched:
        put("search.corpus", asked(sa, "corpus"), default(sa, "corpus"), "the tuning text of the passages")
        put("search.critical_floor", sa.critical_floor, 1.33,
            "the critical pairs' farthest position at the target lands at 3/4 of the original context, not on "
            "their last and least-trained positions (LongRoPE2 wants >= s; RESULTS: 'The critical pairs' floor')")
        tokens = put("search.passage_tokens", sa.passage_tokens, extend_report.judge_passage(L),
                     "a passage: 192 tokens, at most 1/32 of the original context")
        far = put("search.far_from", sa.far_from, L // 2, "the fitness reads tokens only far context predicts: "
                                                        "half the original context and more")
        if far + tokens >= T:   # before the layout: it cuts the distances from far_from to the target into bands
            raise ConfigError(f"search.far_from {far} and search.passage_tokens {tokens} leave no distance to search: "
                              f"a passage repeated at least far_from back must fit before the target {T} (far_from "
                              f"+ passage_tokens < target)")
        passages, width = search_layout(T, L, far, tokens, sa.passages, sa.band_width)
        put("search.passages", sa.passages, passages,
            "2 sequences (the race scores the first), each 56 % passages (48 a sequence at 32k), fewer where they "
            "do not fit")
        put("search.band_width", sa.band_width, width,
            "about target / 8, even: every band from far_from to the target weighs alike in the fitness (wider "
            "where the passages do not fit)")
        put("search.candidates", sa.candidates, 16, "CMA-ES candidates after 5 seeds (the shipped search's 16)")
        put("search.guard_share", sa.guard_share, round(min(1.0, GUARD_SHARE * max(1.0, T / L / 4)), 6),
            "the perplexity guard inside the original context: the shipped search's 8 % up to 4x, in proportion to "
            "s past it (at most 1), as the closed forms' own rise grows (RESULTS: 'The guard past 4x')")
    ta = args.train
    window = put("train.seq_len", ta.seq_len, L // 2, "half the original context: memory follows the window, and "
                                                     "PoSE gives its ids spread over the target")
    put("train.positions", None, "pose chunks=2 text=span",
        f"each window two chunks of a {T}-token span of one document: training pairs up to {T} apart")
    put("train.corpus", asked(ta, "corpus"), default(ta, "corpus"), "long documents (the standard library's packages)")
    put("train.packing", None, "documents" if facts.apart is None else "joined",
        "documents kept apart (each attends only to itself)" if facts.apart is None else
        f"joined: {facts.apart}, so transformers' masks would read PoSE's jumps as new documents")
    put("train.longce_window", ta.longce_window, max(1, L // 16), "LongCE weighs tokens the far context predicts "
                                                                   "better than this short window does")
    put("train.lr", asked(ta, "lr"), 6e-5, "the shipped fine-tune's, constant after min(10, steps / 5) warmup steps")
    put("train.seed", asked(ta, "seed"), 42, "the data order")
    steps = settings_tokens(args, facts, machine, settings, put, window)
    mixed = put("train.short_long_share", ta.short_long_share, SHORT_LONG_SHARE,
                "the share of the short stage's windows drawn as the fine-tune's long ones, to keep the distances it "
                "trained while the contiguous ones take perplexity back"
                + ("" if SHORT_LONG_SHARE else ": none, contiguous windows alone (at 24k a share of 0.5 doubled "
                                               "the stage's steps and kept no more of the middle bins)")
                + " (RESULTS: 'The short stage')")
    put("train.short_steps", ta.short_steps, math.ceil(math.ceil(steps / 4) / (1 - mixed)),
        f"then a short stage: contiguous {min(window, L)}-token windows inside the original context"
        f"{f' ({mixed:g} of its windows long ones)' if mixed else ''}, cross-entropy, as many contiguous ones as a "
        f"quarter of the fine-tune's steps: they take back the perplexity the fine-tune costs there (RESULTS: 'The "
        f"short stage')")
    if ta.short_long_share and ta.short_steps == 0:   # accepted and ignored would let the user believe it acted
        raise ConfigError(f"train.short_long_share {ta.short_long_share:g} with train.short_steps 0: there is no "
                          f"short stage to mix long windows into; drop one of them")
    put("train.short_lr", ta.short_lr, ta.lr / 2, "half the fine-tune's")
    ja = args.judge
    mode = put("judge.mode", asked(ja, "mode"), ja.mode,
               "full: two passage seeds, perplexity, passkey; quick: one seed")
    read = [ta.corpus, *([args.search.corpus] if searched else [])]
    held_out = extend_report.held_out
    corpus = put("judge.corpus", ja.corpus, ja.corpus or next((t for t in TEXTS if held_out(t, read)), None),
                 "a text neither the search nor the fine-tune reads" if ja.corpus is None or held_out(ja.corpus, read)
                 else "NOT held out: a stage trains or searches on it")
    if mode != "skip" and corpus is None:
        raise ConfigError("judge.corpus: every built-in text is read by a stage; name a held-out text")
    left_out = {m: why for m, why in facts.baselines.items() if why}
    put("judge.rows", None, [m for m in BASELINES if m not in left_out],
        "untrained, patched to the target" + "".join(f"; no {m}: {why}" for m, why in left_out.items()))
    put("judge.seeds", None, 2 if mode == "full" else 1, "passage seeds pooled (n doubles)")
    put("judge.passages", ja.passages, max(4, 48 * T // 32768), "recall passages a seed: 48 per 32k of target, "
                                                                 "their distances even over the window")
    put("judge.layout", None, "even", "every distance bin its share of the passages")
    put("judge.bin", ja.bin, max(L // 2, T // 8), "distance bins of the report: the larger of half the original "
                                                  "context and target / 8 (4k up to 32k for an 8k model)")
    put("judge.passkey_depths", None, [0.05, 0.15, 0.25] if mode == "full" else [],
        f"the checkpoint's passkey, the key in the farthest quarter of the window, {extend_report.PASSKEY_TRIALS} "
        f"trials each (too few to tell two rows apart: the other rows are not asked)")
    plan = Plan(settings, facts, machine)
    check_plan(plan)
    return plan


def search_layout(T: int, L: int, far: int, tokens: int, passages: int | None, width: int | None) -> tuple[int, int]:
    """(passages, band width) of the search: 56 % of 2 sequences in passages, the distances from far_from to the
    target cut into bands of about target / 8 (even widths, 2 passages a band in each sequence); where the layout
    cannot place them, fewer bands, then fewer passages. Given values stay as given."""
    from hf_posenc.search import SearchSettings

    span = T - far
    derived = int(0.5625 * T / (2 * tokens)) if passages is None else passages // 2
    counts = [None] if width else range(max(1, round(span / max(1, T // 8))), 0, -1)
    tries = (sorted({max(2, int(derived * 0.9 ** k)) for k in range(60)}, reverse=True) if passages is None
             else [derived])
    for per_sequence in tries:
        for count in counts:
            band = width or math.ceil(span / count)
            if width is None and per_sequence < 2 * math.ceil(span / band):
                continue   # every band needs 2 passages a sequence
            try:
                SearchSettings(model="", target=T, original=L, passages=2 * per_sequence, passage_tokens=tokens,
                               far_from=far, guard_length=guard_length(L), band_width=band, race=True)
            except ValueError:
                continue
            return 2 * per_sequence, band
    if passages is None and width is None:   # nothing given the layout could name: say what does not fit
        raise ConfigError(f"search: no layout of passages fits: passages of {tokens} tokens repeated {far} to {T} "
                          f"tokens back, at least 2 a band; lower search.far_from or search.passage_tokens")
    return 2 * max(2, derived), width or min(span, T // 8)   # check_plan says why the search refuses the given


def settings_tokens(args: ExtendConfig, facts: Facts, machine: tuple, settings: list, put, window: int) -> int:
    """The fine-tune's tokens and steps (returned): --tokens, or the rule (9.375 x target), or what --hours leaves
    after the search (and the short stage) at this machine's rate."""
    T = args.target
    if args.hours:
        tokens_s = RATES[machine[0]].tokens_s
        scale = facts.parameters / REFERENCE_PARAMETERS
        searched = any(s.name == "search" and s.value for s in settings)
        per_candidate = candidate_seconds(facts, machine, T)
        mixed = SHORT_LONG_SHARE if args.train.short_long_share is None else args.train.short_long_share
        # the short stage: a quarter of the steps contiguous, and its long windows beside them
        share = 1.0 if args.train.short_steps == 0 else 1 / (1 + SHORT_STEP_COST / (4 * (1 - mixed)))

        def split(hours: float) -> tuple[int, int]:
            """(search candidates, fine-tune tokens) in these hours: the search takes at most 45 % of them (the
            shipped path's share), the fine-tune what is left but the short stage's share."""
            seconds, candidates = hours * 3600, args.search.candidates
            if searched:
                if candidates is None:
                    candidates = max(0, min(16, int(0.45 * seconds / per_candidate) - 5))
                seconds -= (5 + candidates) * per_candidate
            return candidates, int(share * seconds * tokens_s / scale)

        candidates, tokens = split(args.hours)
        if searched and args.search.candidates is None:
            setting = next(s for s in settings if s.name == "search.candidates")
            setting.value = candidates
            setting.reason = (f"what fits 45 % of --hours {args.hours:g} at ~{per_candidate:.0f} s a candidate "
                              f"(at most 16)" if candidates else f"none: the 5 seeds alone take "
                              f"{5 * per_candidate / (36 * args.hours):.0f} % of --hours {args.hours:g}")
        if tokens < window:
            # from the least the seeds and one step take (more candidates only raise it), up by 0.01 h
            floor = ((5 + (args.search.candidates or 0)) * per_candidate * searched
                     + window * scale / tokens_s / share) / 3600
            least = next(h / 100 for h in itertools.count(math.floor(floor * 100)) if split(h / 100)[1] >= window)
            fewer = " (or fewer --search.candidates)" if searched and args.search.candidates else ""
            raise ConfigError(f"--hours {args.hours:g} leaves no time for one fine-tune step of {window} tokens"
                              f"{' after the search' if searched else ''} on this machine: give at least --hours "
                              f"{least:.2f}{fewer}")
        put("train.tokens", None, tokens, f"what --hours {args.hours:g} leaves after the search"
            f"{' and the short stage' if share < 1 else ''}, at ~{tokens_s / scale:.0f} tokens/s on this machine")
        return put("train.steps", None, tokens // window, f"the whole windows those tokens fill, one {window}-token "
                                                          f"window a step")
    tokens = put("train.tokens", args.tokens or None, int(9.375 * T),
                 "9.375 x target (the shipped 307k tokens at 32k)" if not args.tokens else "--tokens")
    if tokens < window:
        raise ConfigError(f"the fine-tune's budget is {tokens} tokens, below one window of {window}: raise --tokens")
    return put("train.steps", None, math.ceil(tokens / window), f"tokens / window, one {window}-token window a step")


def within(section: str, err: Exception) -> str:
    """An error of a section's settings, named by the section once (their own checks may name it already)."""
    text = str(err)
    return text if text.startswith((f"{section}:", f"{section}.")) else f"{section}: {text}"


def check_plan(plan: Plan) -> None:
    """The settings the stages will get, checked now by their own classes (numbers and paths only: no text, no
    weights), so that nothing is refused hours into a run."""
    from hf_posenc import corpora
    from hf_posenc.eval import recall
    from hf_posenc.train.positions import scheme

    v = plan.value
    if v("search"):
        try:
            search_settings(plan)
        except ValueError as err:
            raise ConfigError(within("search", err)) from None
    window, seq_len = v("train.longce_window"), v("train.seq_len")
    if 2 * window >= seq_len:   # LongCE's stride is its window (the fine-tune recipe's rule, checked hours later)
        raise ConfigError(f"train.longce_window {window} + its stride {window} must be below train.seq_len "
                          f"{seq_len}: only a token after both has a shorter context to compare; lower "
                          f"train.longce_window")
    try:
        scheme(v("train.positions")).resolve(v("target")).check_window(seq_len)
        finetune_sections(plan)
        if v("train.short_steps"):
            short_sections(plan)
    except (ValueError, AttributeError) as err:
        raise ConfigError(within("train", err)) from None
    for name in TEXT_FIELDS:
        spec = v(name) if any(s.name == name for s in plan.settings) else None
        if spec and corpora.names_missing_files(spec):
            raise ConfigError(f"{name} {spec!r}: no such text (a load_corpus spec: kjv, shakespeare, stdlib, local "
                              f".txt/.jsonl/.parquet files, or a hub dataset)")
    if v("judge.mode") != "skip":
        try:
            for head in (0, 1):   # with and without a BOS first
                extend_report.judge_layout(v("target"), v("judge.passages"),
                                           extend_report.judge_passage(plan.facts.original), head, seed=0)
            recall.distance_bins(v("target"), v("judge.bin"))
        except ValueError as err:
            raise ConfigError(f"judge: {err}") from None


class TextNeed(NamedTuple):
    field: str   # the setting that names the text
    spec: str    # the text (a load_corpus spec)
    tokens: int  # the tokens its stage takes of it
    what: str    # the stage's need, in words


def text_needs(plan: Plan, done: dict) -> list[TextNeed]:
    """The texts the stages not done read: the search's recall sequences, one span of the target for the fine-tune
    (PoSE takes each window from one; the short stage a window), the judge's recall sequences and its perplexity
    at the target (counted without a BOS: a token a sequence more than the stages take)."""
    from hf_posenc.eval import recall

    v, T = plan.value, plan.value("target")
    needs = []
    if v("search") and "search" not in done:
        k = recall.cell_sequences(T, v("search.passages"), v("search.passage_tokens"))[1]
        needs.append(TextNeed("search.corpus", v("search.corpus"), k * T,
                              f"the {k * T} that the search's {k} recall sequences of {T} take"))
    if "finetune" not in done:
        needs.append(TextNeed("train.corpus", v("train.corpus"), T,
                              f"one span of the target {T} (PoSE takes each window from one)"))
    elif v("train.short_steps") and "short" not in done:
        needs.append(TextNeed("train.corpus", v("train.corpus"), short_window(plan),
                              f"one short-stage window of {short_window(plan)}"))
    if v("judge.mode") != "skip" and "judge" not in done:
        passage = extend_report.judge_passage(plan.facts.original)
        k = extend_report.judge_layout(T, v("judge.passages"), passage, 0, seed=0)[1]
        needs.append(TextNeed("judge.corpus", v("judge.corpus"), k * T,
                              f"the {k * T} that the judge's {k} recall sequences of {T} take" if k > 1 else
                              f"the target {T}"))
    return needs


def short_window(plan: Plan) -> int:
    """The short stage's window: the fine-tune's, inside the original context."""
    return min(plan.value("train.seq_len"), plan.facts.original)


CHECKPOINT_SECONDS = 600   # a killed fine-tune or short stage loses at most about this much training


def count_words(n: int) -> str:
    """A parameter count as a plan line says it: 135M, 1544M; a tiny model's in thousands (not 0M)."""
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def save_every(plan: Plan, steps: int, window: int, cost: float = 1.0, share: int = 3) -> int:
    """Steps between a stage's checkpoints: a `share` of its steps, or fewer where those would take longer than
    CHECKPOINT_SECONDS at this machine's rate (a step of `window` tokens costing `cost` fine-tune tokens each)."""
    step_seconds = cost * window * token_seconds(plan.facts, plan.machine)
    return max(1, min(steps // share, round(CHECKPOINT_SECONDS / step_seconds)))


def warmup_steps(steps: int) -> int:
    """Each stage's warmup: 10 steps, or a fifth of a shorter stage (a stage of 1-4 steps warms up for none: a step
    at lr 0 would train nothing)."""
    return min(10, steps // 5)


def short_sections(plan: Plan):
    """The short stage's data and train sections: the fine-tune's text, contiguous ids (or, window by window at
    train.short_long_share, the fine-tune's long ones), cross-entropy."""
    from hf_posenc.recipes import finetune_config as fc

    v = plan.value
    steps, mixed = v("train.short_steps"), v("train.short_long_share")
    positions = f"{v('train.positions')} contiguous_share={1 - mixed:g}" if mixed else "contiguous"
    return (fc.FinetuneDataArgs(corpus=v("train.corpus"), seq_len=short_window(plan), packing=v("train.packing")),
            fc.TrainArgs(objective="lm", positions=positions, loss="ce", steps=steps, lr=v("train.short_lr"),
                         warmup_steps=warmup_steps(steps), scheduler="constant_with_warmup",
                         save_every=save_every(plan, steps, short_window(plan), SHORT_STEP_COST, share=2),
                         seed=v("train.seed") + 1))   # other windows than before


def finetune_sections(plan: Plan):
    """The fine-tune's data and train sections (their own checks run as they are built)."""
    from hf_posenc.recipes import finetune_config as fc

    v = plan.value
    steps = v("train.steps")
    return (fc.FinetuneDataArgs(corpus=v("train.corpus"), seq_len=v("train.seq_len"), packing=v("train.packing")),
            fc.TrainArgs(objective="lm", positions=v("train.positions"), loss="longce",
                         longce_window=v("train.longce_window"), steps=steps, lr=v("train.lr"),
                         warmup_steps=warmup_steps(steps), scheduler="constant_with_warmup",
                         save_every=save_every(plan, steps, v("train.seq_len")), seed=v("train.seed")))


def search_stage_config(plan: Plan, model: recipe_config.ModelArgs, output_dir: str):
    """The search stage's config (the search recipe's own: `hf-posenc search` with these flags is the same search)."""
    from hf_posenc.recipes.search_config import SearchArgs, SearchConfig

    v = plan.value
    return SearchConfig(
        model=dataclasses.replace(model, attn_implementation=plan.facts.passes if model.attn_implementation == "auto"
                                  else model.attn_implementation),
        data=recipe_config.DataArgs(corpus=v("search.corpus")),
        search=SearchArgs(
            target=v("target"), mode="static", budget=v("search.candidates"), passages=v("search.passages"),
            passage_tokens=v("search.passage_tokens"), far_from=v("search.far_from"),
            guard_length=guard_length(plan.facts.original), guard_share=v("search.guard_share"),
            top_range=[1.0, 2.0], attention_range=[1.0, 1.3], band_width=v("search.band_width"),
            critical_floor=v("search.critical_floor"), race=True),
        output_dir=output_dir)


def search_settings(plan: Plan):
    """The search's settings as the search recipe derives them from its config, checked by their own class."""
    from hf_posenc.recipes import search as search_recipe

    args = search_stage_config(plan, recipe_config.ModelArgs(name=plan.facts.ref), "")
    return search_recipe.settings(args, plan.facts.ref, plan.facts.original, "float32")


def guard_length(original: int) -> int:
    """Tokens of the search's perplexity guard: 2048, at most a quarter of the original context."""
    return min(2048, original // 4)


def candidate_seconds(facts: Facts, machine: tuple, target: int) -> float:
    """What a search candidate should take on this machine: RATES' 32k figure, scaled as this model's pass at the
    target (pass_cost)."""
    return RATES[machine[0]].candidate * pass_cost(facts, target)


# ---------------------------------------------------------------------------------------------- the run
class ExtendRun:
    """One pipeline run in `out`: its plan recorded (plan.json), the stages done (stages.json: seconds each), the
    time spent so far in a stage not done (clock.json)."""

    def __init__(self, args: ExtendConfig, plan: Plan):
        from hf_posenc import corpora

        self.args, self.plan = args, plan
        texts = [s.value for s in plan.settings if s.name in TEXT_FIELDS]
        inputs = [Path(plan.facts.ref), *(path for spec in texts if spec for path in corpora.corpus_paths(spec))]
        self.out = user_input.output_folder(args.output_dir, "output_dir", [p for p in inputs if p.exists()])
        self.check_folder()

    def check_folder(self) -> None:
        """A new or empty folder, or this run's own: another run's settings refused naming each one (but the judge's:
        those judge the same checkpoint again)."""
        self.rejudge = False
        saved = self.out / "plan.json"
        if not self.out.exists() or not any(self.out.iterdir()):
            return
        if not saved.is_file():
            raise ConfigError(f"output_dir {self.args.output_dir} holds files but no plan.json: not an extend run; "
                              f"choose another --output_dir")
        try:
            there = json.loads(saved.read_text())
            old = there["settings"]
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{saved} cannot be read ({err}): not an extend run's plan; choose another "
                              f"--output_dir") from None
        old = {**PLANNED_BEFORE, **old}
        new = json.loads(json.dumps(self.plan.record()))
        differ = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        self.rejudge = bool(differ) and all(k.startswith(ADJUSTABLE) for k in differ)
        changed = [f"{k}: {format_value(old.get(k))} there, {format_value(new.get(k))} now"
                   for k in differ if not k.startswith(ADJUSTABLE)]
        if there.get("model") != self.plan.facts.name or there.get("model_path") != model_key(self.plan.facts.ref):
            elsewhere = " (another of that name)" if there.get("model") == self.plan.facts.name else ""
            changed.insert(0, f"model: {there.get('model')} there, {self.plan.facts.name}{elsewhere} now")
        if changed:
            raise ConfigError(f"output_dir {self.args.output_dir} holds a run with other settings ({'; '.join(changed)}"
                              f"); run with those settings to resume it, or choose another --output_dir (the "
                              f"judge's settings may change: the run is judged again)")

    @property
    def done(self) -> dict:
        path = self.out / "stages.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def spent(self) -> dict:
        """Seconds spent so far in the stages not finished: a killed run's, counted when the stage resumes."""
        path = self.out / "clock.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def clocked(self, stage: str) -> None:
        """Run a stage, its wall time written down every CLOCK_SECONDS while it runs and added to the time of
        earlier, killed runs of it; stages.json gets the total when it finishes."""
        before, start, stop = self.spent().get(stage, 0.0), time.perf_counter(), threading.Event()

        def write_down() -> None:
            write_json(self.out / "clock.json", {**self.spent(), stage: round(before + time.perf_counter() - start, 1)})

        def beat() -> None:
            while not stop.wait(CLOCK_SECONDS):
                write_down()

        heart = threading.Thread(target=beat, daemon=True)
        heart.start()
        try:
            getattr(self, f"stage_{stage}")()
        finally:
            stop.set()
            heart.join()
            write_down()
        done = self.done
        done[stage] = {"seconds": round(before + time.perf_counter() - start, 1),
                       "finished": time.strftime("%Y-%m-%d %H:%M")}
        write_json(self.out / "stages.json", done)
        write_json(self.out / "clock.json", {k: v for k, v in self.spent().items() if k != stage})

    def run(self) -> Path:
        """The stages not done, one run at a time in the folder; the texts they read checked before anything is
        written (in a folder of a run, once no other run works in it)."""
        fresh = not self.out.exists()
        if fresh:
            self.check_weights()
            self.check_texts()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"output_dir {self.args.output_dir} cannot be made ({err.strerror}): choose a folder "
                              f"this user can write") from None
        done = ", ".join(self.done) or "none"
        with user_input.folder_lock(self.out, f"output_dir {self.args.output_dir} (stages done: {done})"):
            if not fresh:
                self.check_folder()   # again: the run that held the folder may have moved on
                self.check_weights()
                self.check_texts()
            return self.run_stages()

    def check_weights(self) -> None:
        """A model folder's weights read as its config's model (their headers, no tensor loads): a damaged file or
        another model's weights refused before plan.json claims the folder for them."""
        from hf_posenc import loading

        name, extra = loading.resolve(self.plan.facts.ref)
        problem = None if "gguf_file" in extra else loading.weights_problem(name, loading.meta_model(name))
        if problem:
            raise ConfigError(f"--model {self.args.model.name}: {problem}")

    def check_texts(self) -> None:
        kept = {k: v for k, v in self.done.items() if k in TRAINED} if self.rejudge else self.done
        extend_report.check_texts(self.plan.facts.ref, text_needs(self.plan, kept))

    def run_stages(self) -> Path:
        if self.rejudge:   # other judge settings: the trained stages stand, the judge and the export run again
            write_json(self.out / "stages.json", {k: v for k, v in self.done.items() if k in TRAINED})
            write_json(self.out / "clock.json", {k: v for k, v in self.spent().items() if k in TRAINED})
        if self.rejudge or not (self.out / "plan.json").exists():   # replaced whole: a kill leaves one or the other
            write_json(self.out / "plan.json", {"model": self.plan.facts.name,
                                                "model_path": model_key(self.plan.facts.ref),
                                                "settings": self.plan.record(),
                                                "planned": time.strftime("%Y-%m-%d %H:%M")})
        estimates = self.plan.estimates()
        skipped = {"search": not self.plan.value("search"), "short": not self.plan.value("train.short_steps"),
                   "judge": self.plan.value("judge.mode") == "skip"}
        stages = [s for s in STAGES if not skipped.get(s)]
        for i, stage in enumerate(stages, 1):
            if stage in self.done:
                print(f"[{i}/{len(stages)} {stage}] done ({self.done[stage]['seconds'] / 60:.1f} min)", file=sys.stderr)
                continue
            spent = self.spent().get(stage, 0.0) / 60   # a killed run's part of this stage
            here = max(0.0, estimates[stage] - spent)
            left = here + sum(estimates[s] for s in stages[i:] if s not in self.done)
            resumed = (f"{spent:.0f} min of it spent by earlier runs, " + (f"~{here:.0f} min left in it" if here else
                       "past its estimate: its own progress says what is left") + ", ") if spent >= 1 else ""
            print(f"[{i}/{len(stages)} {stage}] ~{estimates[stage]:.0f} min for this stage, {resumed}~{left:.0f} min "
                  f"left in all (estimates)", file=sys.stderr)
            self.clocked(stage)
        print(f"extended checkpoint: {self.out} (REPORT.md, README.md)", file=sys.stderr)
        return self.out

    # -- the stages
    def stage_search(self) -> None:
        from hf_posenc.recipes import search as search_recipe
        from hf_posenc.recipes.search_config import check_args

        args = search_stage_config(self.plan, self.args.model, str(self.out / "search"))
        check_args(args)
        search_recipe.run(args)

    def start_folder(self) -> str:
        return str(self.out / "search" / "best") if self.plan.value("search") else self.plan.facts.ref

    @property
    def trained(self) -> Path:
        """The extended checkpoint's folder: the short stage's, or the fine-tune's where there is none."""
        return self.out / ("short" if self.plan.value("train.short_steps") else "finetune")

    def stage_finetune(self) -> None:
        v = self.plan.value
        self.train_in("finetune", self.start_folder(), *finetune_sections(self.plan),
                      posenc=None if v("search") else {"method": "yarn", "max_position_embeddings": v("target")})

    def stage_short(self) -> None:
        self.train_in("short", str(self.out / "finetune"), *short_sections(self.plan), posenc=None)

    def train_in(self, folder: str, start: str, data, train, posenc) -> None:
        train_stage(self.args.model, self.out / folder, start, data, train, posenc)

    def stage_judge(self) -> None:
        extend_report.judge(self)

    def stage_export(self) -> None:
        extend_report.export(self)


def train_stage(model: recipe_config.ModelArgs, out: Path, start: str, data, train, posenc) -> None:
    """One fine-tune recipe run in `out` from `start`, resumed from its last checkpoint where it has one."""
    from hf_posenc.recipes import finetune_config as fc
    from hf_posenc.recipes.finetune import RUN
    from hf_posenc.recipes.finetune_recipe import FinetuneRecipe
    from hf_posenc.train import checkpoints as ckpt

    started = out.is_dir() and any(out.iterdir())
    resume = started and ckpt.latest_checkpoint(str(out))[0] is not None
    cfg = fc.FinetuneConfig(
        model=fc.FinetuneModelArgs(name=start, dtype=model.dtype, attn_implementation=model.attn_implementation),
        data=data, train=train, eval=fc.FinetuneEvalArgs(lengths=[]), posenc=posenc,
        output_dir=str(out), resume=resume, overwrite_output_dir=started and not resume)
    recipe = FinetuneRecipe(cfg, progress=RUN)
    recipe.setup()
    recipe.train()


def model_key(ref: str) -> str:
    """Which model a run is of, without its machine path: a hash of where it lies (a hub id as itself)."""
    import hashlib

    path = Path(ref).expanduser()
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16] if path.exists() else ref


def run(args: ExtendConfig) -> Path | None:
    """The plan (printed before any weights load), then the stages."""
    started = time.perf_counter()
    plan = make_plan(args, model_facts(args), machine_kind(args.model.dtype))
    pipeline = ExtendRun(args, plan)   # an output_dir it cannot use: refused in one line, before the plan is shown
    print(plan.text(), file=sys.stderr)
    print(f"(planned in {time.perf_counter() - started:.1f} s; output_dir {args.output_dir})", file=sys.stderr)
    if args.plan_only:
        return None
    return pipeline.run()


def main(argv: list[str] | None = None, prog: str | None = None):
    """The recipe's entry: a refusal is one line `error: ...` and exit code 2; Ctrl-C says how to go on."""
    try:
        with user_input.refusals():
            return run(parse_args(argv, prog))
    except KeyboardInterrupt:
        print("\ninterrupted: what each stage finished is kept; run the same command to go on", file=sys.stderr)
    raise SystemExit(130)


if __name__ == "__main__":
    main()
