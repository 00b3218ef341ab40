"""The attention-distance profile of a real model on a real text: the mean attention weight a query gives
a key d positions before it, per layer, before and after a patch, at lengths inside and past the
original context.

The weights come from the model itself: it runs with transformers' eager attention (the only
implementation that materialises the softmax weights; sdpa and flash attention never form them), and
a forward hook on each attention module reduces that layer's (heads, L, L) weights to a profile at
once, so only one layer's weights are alive at a time and nothing depends on how a family computes
q and k. Eager attention costs O(L^2) memory per layer: on a CPU keep lengths to a few thousand
tokens."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..attention import PREFIX
from ..config import MethodConfig
from ..errors import InvalidParameterError, SequenceTooLongError, UnsupportedModelError
from ..families.learned_tables import check_length
from . import _model
from ._output import PlotResult, log_bins, new_figure, require_matplotlib, write


class _ProfileHook:
    """Accumulates, per attention module, the weights the last `queries` queries give to the keys at
    each distance d = query - key >= 0, summed over heads, and how many (head, query) pairs have a key
    there."""

    def __init__(self, queries: int):
        self.queries = queries
        self.sums: list[torch.Tensor] = []
        self.counts: list[torch.Tensor] = []
        self._last = None  # an outer module returning its inner module's weights is the same layer

    def __call__(self, module, args, output):
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if not isinstance(weights, torch.Tensor) or weights.ndim != 4 or weights.shape[-1] != weights.shape[-2]:
            return
        if weights is self._last:
            return
        self._last = weights
        heads, length = weights.shape[1], weights.shape[-1]
        rows = torch.arange(max(0, length - self.queries), length, device=weights.device)
        distance = torch.arange(length, device=weights.device)
        keys = rows[:, None] - distance[None, :]  # (queries, distances)
        valid = keys >= 0
        picked = weights[0][:, rows, :].float()  # (heads, queries, keys)
        gathered = picked.gather(2, keys.clamp(min=0).expand(heads, -1, -1)) * valid
        self.sums.append(gathered.sum((0, 1)).to("cpu", torch.float64))
        self.counts.append((valid.sum(0) * heads).to("cpu", torch.float64))


@contextlib.contextmanager
def _eager(model: torch.nn.Module):
    previous = model.config._attn_implementation
    # a model patched with an attention method (ALiBi, ...) keeps its patch on hf_posenc's eager variant
    eager = PREFIX + "eager" if previous.startswith(PREFIX) else "eager"
    if previous != eager:
        model.set_attn_implementation(eager)
    try:
        yield
    finally:
        if previous != eager:
            model.set_attn_implementation(previous)


def check_memory(model: torch.nn.Module, length: int) -> None:
    """Eager attention holds a layer's weights for every head, query and key (twice: the scores and their softmax,
    in float32): a length whose weights this machine cannot hold is refused before the pass, not left to the
    allocator (an error deep in the forward, or the kernel's OOM killer once memory ran out)."""
    import psutil

    text = model.config.get_text_config()
    heads = next((getattr(text, k) for k in ("num_attention_heads", "n_head") if getattr(text, k, None)), None)
    device = next(model.parameters()).device
    if heads is None or device.type not in ("cpu", "cuda"):
        return
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else psutil.virtual_memory().available
    need = 2 * heads * length ** 2 * 4
    if need > free:
        raise InvalidParameterError(
            f"{length} tokens: eager attention holds {heads} heads x {length} x {length} weights per layer "
            f"(~{need / 2**30:.1f} GiB), more than the {free / 2**30:.1f} GiB free on the {device.type}; use "
            f"shorter lengths (the attention plot runs every length it is given whole)")


def attention_lengths(model: torch.nn.Module, lengths: Sequence[int] | None, patched: bool, params: dict) -> list[int]:
    """The lengths plot_attention runs: those given, else half the original context and the target (the
    original when nothing is patched)."""
    original, _ = _model.contexts(model)
    params = _model.target_params(params, original)
    target = int(params.get("max_position_embeddings") or round(original * params["factor"]))
    return sorted({int(n) for n in (lengths or (original // 2, target if patched else original))})


@torch.inference_mode()
def attention_profile(model: torch.nn.Module, ids: torch.Tensor, *, queries: int = 256) -> torch.Tensor:
    """(layers, L) for token ids of shape (L,) or (1, L): entry [l, d] is the mean over heads and over the
    last `queries` queries of the weight layer l gives the key d positions before the query (d = 0: the
    query itself); NaN where no sampled query has a key that far back. Runs one forward pass of the
    model with eager attention (set for the call, then put back)."""
    ids = torch.as_tensor(ids)
    ids = ids.reshape(1, -1) if ids.ndim == 1 else ids
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise InvalidParameterError(f"ids must be one sequence of token ids, shape (L,) or (1, L), "
                                    f"got {tuple(ids.shape)}")
    if queries < 1:
        raise InvalidParameterError(f"queries must be >= 1, got {queries!r}")
    check_length(model, ids.shape[1])
    check_memory(model, ids.shape[1])
    hook = _ProfileHook(queries)
    handles = [m.register_forward_hook(hook) for m in model.modules() if "Attention" in type(m).__name__]
    device = next(model.parameters()).device
    try:
        with _eager(model):
            kwargs = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
            model(input_ids=ids.to(device), **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if not hook.sums:
        raise UnsupportedModelError(
            f"no attention weights came out of this {model.config.model_type} model's attention modules with eager "
            f"attention; the attention plot needs a model whose attention returns its weights"
        )
    sums, counts = torch.stack(hook.sums), torch.stack(hook.counts)
    return torch.where(counts > 0, sums / counts.clamp_min(1), torch.nan)


def plot_attention(model: torch.nn.Module, ids: torch.Tensor, out: str | Path, *,
                   lengths: Sequence[int] | None = None, methods: str | MethodConfig | Sequence = (),
                   queries: int = 256, name: str = "attention", **params) -> PlotResult:
    """The attention-distance profile of `model` on the token ids `ids` (the first L tokens for each L in
    `lengths`), per layer, as loaded and patched with each of `methods` (a name, a method config, or a
    list of them; target context from max_position_embeddings= or factor=, default 2x the original;
    unpatched after). A length the model cannot take (past a learned table) is skipped there and
    recorded in the JSON. `lengths` defaults to half the original context and the new one: one
    inside, one past it. Rows of the figure: lengths; columns: as loaded, each patch, then their
    means over layers together. Writes out/attention.png/.csv/.json; the CSV has a `distance` column,
    then one per condition, length and layer."""
    require_matplotlib()  # before minutes of forward passes
    methods = [methods] if isinstance(methods, (str, MethodConfig)) else list(methods or ())
    original, _ = _model.contexts(model)
    params = _model.target_params(params, original)
    lengths = attention_lengths(model, lengths, bool(methods), params)
    ids = torch.as_tensor(ids).reshape(-1)
    if lengths[0] < 2:
        raise InvalidParameterError(f"lengths must be >= 2 tokens, got {lengths}")
    if len(ids) < lengths[-1]:
        raise InvalidParameterError(f"the text has {len(ids)} tokens; lengths up to {lengths[-1]} need as many")

    conditions = ["as loaded"] + [f"patched: {_model.method_label(m)}" for m in methods]
    profiles: dict[tuple[str, int], torch.Tensor] = {}
    skipped: dict[str, str] = {}

    def run(condition: str) -> None:
        for length in lengths:
            try:
                profiles[condition, length] = attention_profile(model, ids[:length], queries=queries)
            except SequenceTooLongError as err:
                skipped[f"{condition}, {length} tokens"] = str(err)

    run(conditions[0])
    for method, condition in zip(methods, conditions[1:]):
        with _model.patched(model, method, params, "attention"):
            run(condition)
    if not profiles:
        raise SequenceTooLongError(f"no length in {lengths} fits the model: {next(iter(skipped.values()))}")

    layers = next(iter(profiles.values())).shape[0]
    columns = len(conditions) + (1 if len(conditions) > 1 else 0)
    figure = new_figure(4.2 * columns + 1.0, 3.4 * len(lengths) + 0.6)
    axes = figure.subplots(len(lengths), columns, squeeze=False, sharey="row")
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.ticker import MaxNLocator

    depth = colormaps["viridis"]
    for row, length in enumerate(lengths):
        for col, condition in enumerate(conditions):
            ax = axes[row, col]
            ax.set_title(f"{condition}, {length} tokens", fontsize=10)
            profile = profiles.get((condition, length))
            if profile is None:
                ax.text(0.5, 0.5, f"not run:\n{length} tokens is longer\nthan the position table",
                        ha="center", va="center", transform=ax.transAxes, fontsize=10)
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            for layer in range(layers):
                centres, means = log_bins(profile[layer].numpy())
                ax.plot(centres, means, color=depth(layer / max(layers - 1, 1)), lw=0.9, alpha=0.85)
            centres, means = log_bins(np.nanmean(profile.numpy(), 0))
            ax.plot(centres, means, color="black", lw=2, label="mean over layers")
            _decorate(ax, original, length)
            if row == 0 and col == 0:
                ax.legend(fontsize=8, loc="lower left")
        if len(conditions) > 1:
            ax = axes[row, -1]
            for col, condition in enumerate(conditions):
                profile = profiles.get((condition, length))
                if profile is not None:
                    centres, means = log_bins(np.nanmean(profile.numpy(), 0))
                    ax.plot(centres, means, color=f"C{col}", lw=1.8, label=condition)
            _decorate(ax, original, length)
            ax.set_title(f"mean over layers, {length} tokens", fontsize=10)
            ax.legend(fontsize=8, loc="lower left")
        axes[row, 0].set_ylabel("mean attention weight")
    for ax in axes[-1]:
        ax.set_xlabel("distance query - key (tokens)")
    bar = figure.colorbar(ScalarMappable(Normalize(0, layers - 1), cmap=depth), ax=axes.ravel().tolist(),
                          label="layer (thin lines)", shrink=0.8)
    bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    figure.suptitle(f"Attention against distance, {model.config.model_type}: the last {queries} queries of each "
                    f"text, keys at or before them (original context {original})")

    data = {"distance": np.arange(lengths[-1])}
    for (condition, length), profile in profiles.items():
        for layer in range(layers):
            data[f"{condition}; {length} tokens; layer {layer}"] = profile[layer]
    info = {"what": "attention", "model_type": model.config.model_type, "original_context": original,
            "methods": [_model.method_label(m) for m in methods], "params": params,
            "lengths": lengths, "queries": queries, "layers": layers, "skipped": skipped,
            "csv": "distance d, then per condition, length and layer the mean over heads and the last `queries` "
                   "queries of the weight on the key d tokens before the query"}
    return write(figure, out, name, data, info)


def _decorate(ax, original: int, length: int) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    if original < length:
        ax.axvline(original, color="black", ls="--", lw=1, label=f"original context ({original})")
