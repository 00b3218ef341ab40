"""RoPE models: the wavelength of each rotary pair against the original and the new context, coloured
by how much each scaling method stretches it, and the long-range decay of the expected q.k score.

Pair i turns by theta_i per position, so it completes a full turn every 2*pi/theta_i positions (its
wavelength). Pairs whose wavelength is shorter than the trained context have seen every angle; the
others have not, and a longer context shows them angles they never saw. That is why YaRN and Llama 3
leave the fast pairs alone and interpolate only the slow ones, while linear interpolation stretches
every pair and NTK stretches them progressively."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import _compat
from ..config import MethodConfig
from ..errors import InvalidParameterError, MethodNotApplicableError
from ..methods.rope import LengthDependentRotary
from ..registry import find_family
from . import _model
from ._output import PlotResult, log_bins, new_figure, write

DEFAULT_METHODS = ("linear", "ntk", "yarn", "llama3")


@dataclass
class RopeFrequencies:
    """The rotary frequencies theta_i (float64, one per pair) a model uses at `length` tokens, and the scale
    on cos/sin (YaRN's attention factor; 1 for most methods)."""

    label: str
    inv_freq: torch.Tensor
    attention_scaling: float
    length: int

    @property
    def wavelength(self) -> torch.Tensor:
        return 2 * math.pi / self.inv_freq


def _rotary(model: torch.nn.Module):
    family = find_family(model)
    if family.mechanism != "rope":
        raise MethodNotApplicableError(
            f"this {model.config.model_type} model uses {family.mechanism} positions, not RoPE (the wavelengths "
            f"and decay plots are for RoPE models; for position tables use table or similarity)"
        )
    layer_type = _compat.global_layer_types(model.config.get_text_config())[0]
    return family.rotary_modules(model)[0][2], layer_type


def rotary_cos_sin(module: torch.nn.Module, positions: torch.Tensor, layer_type: str | None = None):
    """cos and sin (float64, (len(positions), rotary_dim)) from a rotary module's own forward."""
    buffer = next(b for name, b in module.named_buffers() if name.endswith("inv_freq"))
    x = torch.zeros(1, 1, 1, dtype=torch.float32, device=buffer.device)
    args = (layer_type,) if layer_type is not None and "layer_type" in inspect.signature(module.forward).parameters \
        else ()
    with torch.no_grad():
        cos, sin = module(x, positions.reshape(1, -1).to(buffer.device), *args)
    return cos[0].to("cpu", torch.float64), sin[0].to("cpu", torch.float64)


def rope_frequencies(model: torch.nn.Module, method: str | MethodConfig | None = None, *,
                     length: int | None = None, **params) -> RopeFrequencies:
    """The frequencies of a RoPE model as it is (`method=None`), or patched with `method` (target context
    from max_position_embeddings= or factor=, default 2x the original; the model is unpatched after).
    Read from the model's rotary module after a call at `length` tokens (default: its context), so
    methods whose frequencies follow the input length (dynamic, dynamic_yarn, longrope) give the ones
    they use at that length."""
    original, _ = _model.contexts(model)
    with _model.patched(model, method, _model.target_params(params, original), "RoPE"):
        module, layer_type = _rotary(model)
        n = int(length or _model.contexts(model)[1])
        rotary_cos_sin(module, torch.tensor([0, n - 1]), layer_type)  # sets length-dependent frequencies
        inner = module.inner if isinstance(module, LengthDependentRotary) else module
        prefix = "" if layer_type is None else f"{layer_type}_"
        inv_freq = getattr(inner, prefix + "inv_freq").detach().to("cpu", torch.float64)
        scaling = float(getattr(inner, prefix + "attention_scaling", 1.0))
    return RopeFrequencies(label=_model.method_label(method) if method is not None else "as loaded",
                           inv_freq=inv_freq, attention_scaling=scaling, length=n)


def expected_score(freqs: RopeFrequencies, distances: torch.Tensor) -> torch.Tensor:
    """E[<R_m v, R_n v>] / E[|v|^2] for a query and a key that carry the same vector v ~ N(0, I) over the
    rotary channels, at distance m - n: a^2 * mean_i cos((m - n) * theta_i), a the cos/sin scale.
    1 (times a^2) at distance 0; it falls as the pairs drift out of phase (RoFormer's long-range decay)."""
    distances = torch.as_tensor(distances, dtype=torch.float64)
    return freqs.attention_scaling ** 2 * torch.cos(distances[:, None] * freqs.inv_freq[None, :]).mean(1)


def _methods(model, methods: Sequence, params: dict) -> list[RopeFrequencies]:
    if not methods:
        raise InvalidParameterError("methods must name at least one RoPE method")
    found = []
    for spec in methods:
        method, extra = (spec, {}) if isinstance(spec, (str, MethodConfig)) else spec
        found.append(rope_frequencies(model, method, **{**params, **extra}))
    return found


def _context_lines(ax, original: int, target: int, horizontal: bool) -> None:
    line = ax.axhline if horizontal else ax.axvline
    line(original, color="black", ls="--", lw=1.2, label=f"original context ({original})")
    if target != original:
        line(target, color="black", ls=":", lw=1.5, label=f"new context ({target})")


def plot_wavelengths(model: torch.nn.Module, out: str | Path, *, methods: Sequence = DEFAULT_METHODS,
                     name: str = "wavelengths", **params) -> PlotResult:
    """Per rotary pair i, the wavelength 2*pi/theta_i against the original and the new context, one panel
    per method: the original wavelengths in grey, the method's in colour, coloured by the stretch
    theta_i / theta_i' it applies (1: the pair is left as trained, s: interpolated by the whole factor).
    `methods` are names, (name, params) pairs or method configs; `params` (max_position_embeddings=,
    factor=, ...) apply to every method, the target context is 2x the original by default. The model
    must be unpatched. Writes out/wavelengths.png/.csv/.json."""
    original, _ = _model.contexts(model)
    base = rope_frequencies(model)
    scaled = _methods(model, methods, params)
    target = max(f.length for f in scaled)
    stretch = {f.label: (base.inv_freq / f.inv_freq).numpy() for f in scaled}
    top = max(max(float(s.max()) for s in stretch.values()), 1.0 + 1e-6)
    pairs = np.arange(len(base.inv_freq))

    figure = new_figure(3.0 * len(scaled) + 1.4, 4.4)
    axes = figure.subplots(1, len(scaled), sharey=True, squeeze=False)[0]
    from matplotlib.colors import Normalize

    norm = Normalize(vmin=1.0, vmax=top)
    for ax, freqs in zip(axes, scaled):
        ax.plot(pairs, base.wavelength.numpy(), color="0.6", lw=1.2, label="original wavelength")
        points = ax.scatter(pairs, freqs.wavelength.numpy(), c=stretch[freqs.label], cmap="plasma", norm=norm, s=16,
                            zorder=3, label=f"{freqs.label} wavelength")
        _context_lines(ax, original, freqs.length, horizontal=True)
        ax.set_yscale("log")
        inside = int((base.wavelength < original).sum())
        title = f"{freqs.label}"
        if abs(freqs.attention_scaling - 1) > 1e-9:
            title += f" (cos/sin x {freqs.attention_scaling:.3f})"
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"rotary pair i ({inside} of {len(pairs)} turn fully\ninside the original context)", fontsize=9)
    axes[0].set_ylabel("wavelength 2π/θ_i (positions)")
    axes[0].legend(fontsize=7, loc="upper left")
    figure.colorbar(points, ax=list(axes), label="stretch θ_i / θ_i'  (1 = as trained)", shrink=0.9)
    figure.suptitle(f"RoPE wavelengths of {model.config.model_type} (θ base "
                    f"{_theta(model):g}, rotary dim {2 * len(pairs)}): context {original} -> {target}")

    data = {"pair": pairs, "inv_freq": base.inv_freq, "wavelength": base.wavelength}
    for freqs in scaled:
        data |= {f"{freqs.label}: inv_freq": freqs.inv_freq, f"{freqs.label}: wavelength": freqs.wavelength,
                 f"{freqs.label}: stretch": stretch[freqs.label]}
    info = {"what": "wavelengths", "model_type": model.config.model_type, "rope_theta": _theta(model),
            "rotary_dim": 2 * len(pairs), "original_context": original,
            "pairs_turning_inside_original_context": int((base.wavelength < original).sum()),
            "methods": {f.label: {"length": f.length, "attention_scaling": f.attention_scaling} for f in scaled},
            "params": params,
            "csv": "pair i, the original theta_i and wavelength 2*pi/theta_i, then per method its theta_i', "
                   "wavelength and stretch theta_i / theta_i'"}
    return write(figure, out, name, data, info)


def plot_decay(model: torch.nn.Module, out: str | Path, *, methods: Sequence = DEFAULT_METHODS,
               max_distance: int | None = None, name: str = "decay", **params) -> PlotResult:
    """The expected q.k score against distance (see `expected_score`), for the model as it is and patched
    with each method, out to `max_distance` (default: the new context). Drawn as means over log-spaced
    bins of distance (the exact value at every distance oscillates; the CSV holds every distance).
    Writes out/decay.png/.csv/.json."""
    original, _ = _model.contexts(model)
    curves = [rope_frequencies(model), *_methods(model, methods, params)]
    curves[0].label = "none (as loaded)"
    target = max(f.length for f in curves)
    n = int(max_distance or target)
    distances = torch.arange(n + 1)
    scores = {f.label: expected_score(f, distances).numpy() for f in curves}

    figure = new_figure(8.0, 4.8)
    ax = figure.add_subplot()
    for i, (label, values) in enumerate(scores.items()):
        centres, means = log_bins(values)
        ax.plot(centres, means, lw=2.2 if i == 0 else 1.4, color="black" if i == 0 else f"C{i - 1}", label=label)
    _context_lines(ax, original, target, horizontal=False)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("distance m - n (positions)")
    ax.set_ylabel("expected q.k score / E|q|²")
    ax.legend(fontsize=8)
    ax.set_title(f"Long-range decay of the RoPE score, {model.config.model_type} (θ base {_theta(model):g}): "
                 f"q = k ~ N(0, I),\nmean of a²·cos((m-n)·θ_i) over pairs, averaged over log-spaced distance bins",
                 fontsize=10)
    data = {"distance": distances, **scores}
    info = {"what": "decay", "model_type": model.config.model_type, "original_context": original,
            "new_context": target, "params": params,
            "methods": {f.label: {"length": f.length, "attention_scaling": f.attention_scaling} for f in curves},
            "csv": "distance, then per method a^2 * mean_i cos(distance * theta_i): the expected score of a query "
                   "and a key carrying the same random vector, over its expected squared norm"}
    return write(figure, out, name, data, info)


def _theta(model: torch.nn.Module) -> float:
    config = model.config.get_text_config()
    layer_type = _compat.global_layer_types(config)[0]
    return float(_compat.get_rope_parameters(config, layer_type).get("rope_theta", float("nan")))
