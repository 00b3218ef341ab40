"""Sinusoidal absolute positions (Vaswani et al. 2017), the fits that start them close to a learned
table, then the module that replaces the learned table with them.

    PE(pos, 2i)   = sin(pos / base^(2i/d))
    PE(pos, 2i+1) = cos(pos / base^(2i/d))          base = 10000 in the paper

Each pair (2i, 2i+1) turns on a circle at its own frequency, so PE(pos + k) is PE(pos) rotated by
k / base^(2i/d) in every pair: a fixed linear map of PE(pos) for each shift k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..config import Contract, LearnedMethodConfig, Refused, check_bool, check_number, register_method
from ..errors import CheckpointMismatchError, InvalidParameterError
from .learned import table_rows

DEFAULT_BASE = 10000.0


def sinusoidal_table(positions: torch.Tensor, dim: int, base: float = DEFAULT_BASE) -> torch.Tensor:
    """PE at `positions` (any shape, any real values), in float64: shape (*positions.shape, dim).
    An odd `dim` ends with a sine column."""
    positions = torch.as_tensor(positions).to(torch.float64)
    even = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)  # the 2i of each pair
    angles = positions.unsqueeze(-1) / base ** (even / dim)
    table = torch.empty(*positions.shape, dim, dtype=torch.float64, device=positions.device)
    table[..., 0::2] = torch.sin(angles)
    table[..., 1::2] = torch.cos(angles[..., : dim // 2])
    return table


def rms(values: torch.Tensor) -> float:
    return float(values.double().pow(2).mean().sqrt())


@dataclass
class AffineFit:
    """rows ~ features @ weight + bias, and how far the fit is from the rows it was fitted to:
    ||fit - rows|| / ||rows|| (Frobenius norms)."""

    weight: torch.Tensor  # (d_features, d_rows), float64
    bias: torch.Tensor  # (d_rows,), float64
    relative_error: float


def fit_affine(features: torch.Tensor, rows: torch.Tensor, ridge: float) -> AffineFit:
    """Least squares for rows ~ features @ W + b, with the ridge term lambda * ||W||^2,
    lambda = ridge * n / 2 for n rows (n / 2 is the mean eigenvalue of the Gram matrix of n PE rows,
    so `ridge` means the same at every length). Solved in float64 on the CPU."""
    features, rows = features.detach().double().cpu(), rows.detach().double().cpu()
    feature_mean, row_mean = features.mean(0), rows.mean(0)
    centred_features, centred_rows = features - feature_mean, rows - row_mean
    dim = features.shape[1]
    # ridge as ordinary least squares on the system stacked with sqrt(lambda) * I = 0
    penalty = (ridge * len(features) / 2) ** 0.5 * torch.eye(dim, dtype=torch.float64)
    lhs = torch.cat([centred_features, penalty])
    rhs = torch.cat([centred_rows, rows.new_zeros(dim, rows.shape[1])])
    weight = torch.linalg.lstsq(lhs, rhs, driver="gelsd").solution
    bias = row_mean - feature_mean @ weight
    error = float((features @ weight + bias - rows).norm() / rows.norm().clamp_min(1e-30))
    return AffineFit(weight=weight, bias=bias, relative_error=error)


class SinusoidalPositions(nn.Module):
    """In place of a learned table: row r < `kept` returns a kept learned row (the rows below position
    0 that padding reads, and the first `keep_learned` positions when asked); row r >= kept returns
    PE(r - offset) times `scale`, or through the fitted affine map (`projection`).

    Unbounded: a row past the cached table extends the cache. The cache (the whole table over the rows
    seen so far) makes a call one lookup, like the learned table it replaced; it is rebuilt when the
    kept rows or the projection change (optimizer step, load_state_dict). A trainable projection is
    computed on each call while gradients are on.

    Saved as `weight`: the table it equals on its first `rows` rows, which stock transformers loads as
    the family's learned table; the projection (init="fit") is saved next to it."""

    def __init__(self, dim: int, *, rows: int, offset: int, call: str, kept_rows: torch.Tensor,
                 base: float = DEFAULT_BASE, scale: float = 1.0, fit: AffineFit | None = None,
                 trainable: bool = False):
        super().__init__()
        self.dim, self.rows, self.offset, self.call, self.base, self.scale = dim, rows, offset, call, base, scale
        dtype, device = kept_rows.dtype, kept_rows.device
        self.register_buffer("kept_rows", kept_rows.detach().clone(), persistent=False)
        self.projection = None
        if fit is not None:
            self.projection = nn.Linear(dim, dim, dtype=dtype, device=device)
            with torch.no_grad():
                self.projection.weight.copy_(fit.weight.T)  # Linear computes x @ weight.T
                self.projection.bias.copy_(fit.bias)
            self.projection.requires_grad_(trainable)
        self.register_buffer("_cache", torch.empty(0, dim, dtype=dtype, device=device), persistent=False)
        self._cache_key: tuple | None = None
        self._fill_cache(rows)

    @property
    def limit(self) -> None:
        """No limit on the number of positions."""
        return None

    def forward(self, input: torch.Tensor, past_key_values_length: int = 0,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        rows = table_rows(self.call, self.offset, input, past_key_values_length, position_ids)
        if self.projection is not None and self.projection.weight.requires_grad and torch.is_grad_enabled():
            return self._compute(rows)
        needed, cached = (int(rows.max()) + 1 if rows.numel() else 0), self._cache.shape[0]
        if needed > cached:
            self._fill_cache(max(needed, 2 * cached))  # doubling: a growing input rebuilds it rarely
        elif self._cache_key != self._current_key():
            self._fill_cache(cached)
        return F.embedding(rows, self._cache)

    @torch.no_grad()
    def table(self, rows: int) -> torch.Tensor:
        """Rows 0..rows-1 as a plain table, in the module's dtype (computed in float64)."""
        kept = self.kept_rows.shape[0]
        positions = torch.arange(kept - self.offset, rows - self.offset, device=self.kept_rows.device)
        values = self._values(sinusoidal_table(positions, self.dim, self.base), torch.float64)
        return torch.cat([self.kept_rows[:rows].double(), values]).to(self.kept_rows.dtype)

    # -- helpers -------------------------------------------------------------------------------

    def _values(self, features: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.projection is None:
            return (features * self.scale).to(dtype)
        features = features.to(dtype)
        return features @ self.projection.weight.to(dtype).T + self.projection.bias.to(dtype)

    def _compute(self, rows: torch.Tensor) -> torch.Tensor:
        """With autograd through the projection: PE of each row's position, then the kept rows."""
        kept = self.kept_rows.shape[0]
        dtype = self.projection.weight.dtype
        features = sinusoidal_table(rows.clamp(min=kept) - self.offset, self.dim, self.base)
        out = self._values(features, dtype)
        if kept:
            kept_values = F.embedding(rows.clamp(max=kept - 1), self.kept_rows).to(dtype)
            out = torch.where((rows < kept).unsqueeze(-1), kept_values, out)
        return out

    def _current_key(self) -> tuple:
        tensors = [self.kept_rows, *(self.projection.parameters() if self.projection is not None else [])]
        return tuple(t._version for t in tensors)

    def _fill_cache(self, rows: int) -> None:
        self._cache = self.table(max(rows, self.rows))
        self._cache_key = self._current_key()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.table(self.rows)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        key = prefix + "weight"
        if key in state_dict:  # the materialised table: only its kept rows are state
            with torch.no_grad():
                self.kept_rows.copy_(state_dict[key][: self.kept_rows.shape[0]])
            if key in unexpected_keys:
                unexpected_keys.remove(key)
        elif strict:
            missing_keys.append(key)

    def extra_repr(self) -> str:
        init = "fit" if self.projection is not None else f"scale={self.scale:g}"
        return (f"dim={self.dim}, rows={self.rows}, offset={self.offset}, kept={self.kept_rows.shape[0]}, "
                f"base={self.base:g}, {init}, call={self.call!r}")


# -- the method -------------------------------------------------------------------------------------

SINUSOIDAL_INITS = ("raw", "scaled", "fit")


@register_method
@dataclass
class SinusoidalConfig(LearnedMethodConfig):
    """The sinusoidal formula (Vaswani et al. 2017) PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...) in place of the
    learned table, at any length. `init`: "raw" (the formula as it is), "scaled" (times the ratio of the
    learned table's RMS to the formula's), "fit" (PE(pos) @ W + b, W and b fitted by least squares to the
    learned table). `fit_ridge` shrinks W (ridge lambda = fit_ridge * n / 2 for n fitted positions): an
    exact fit uses huge weights on the near-polynomial low frequencies and explodes past the original
    context. `trainable` (fit only) leaves W and b trainable. `keep_learned` keeps the first k positions'
    learned rows (position 0 of BERT/GPT-2 tables is an outlier no sinusoid fits). `max_position_embeddings`
    only sets the advertised context and the length of the table a saved checkpoint holds."""

    name: ClassVar[str] = "sinusoidal"
    unbounded: ClassVar[bool] = True  # a function of the position: any length
    summary: ClassVar[str] = "fixed sinusoidal positions in place of a learned table, any length; init raw/scaled/fit"
    contract: ClassVar[Contract] = Contract(
        examples=({}, {"init": "raw"}, {"init": "scaled", "keep_learned": 2},
                  {"init": "fit", "trainable": True}),
        refused=(Refused({"factor": 2, "init": "learned"}, "init must be one of"),
                 Refused({"factor": 2, "keep_learned": 10**6}, "keeps every position"),
                 Refused({"factor": 2, "trainable": True, "init": "raw"}, "trainable=True needs init='fit'")),
        reference="tests/test_sinusoidal.py::test_table_is_the_paper_formula",
    )

    init: str = "fit"
    base: float = 10000.0
    trainable: bool = False
    fit_ridge: float = 0.1
    keep_learned: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.init, str) or self.init not in SINUSOIDAL_INITS:
            raise InvalidParameterError(f"init must be one of {list(SINUSOIDAL_INITS)}, got {self.init!r}")
        check_number("base", self.base, above=1, optional=False)
        check_number("fit_ridge", self.fit_ridge, minimum=0, optional=False)
        check_number("keep_learned", self.keep_learned, minimum=0, integer=True, optional=False)
        check_bool("trainable", self.trainable)
        if self.trainable and self.init != "fit":
            raise InvalidParameterError(
                f"trainable=True needs init='fit' (init={self.init!r} has no weights to train; the fitted W and b are)"
            )

    def build_table(self, old: nn.Embedding, *, offset: int, positions: int, call: str) -> tuple[nn.Module, dict]:
        if self.keep_learned >= positions:
            raise InvalidParameterError(
                f"keep_learned={self.keep_learned} keeps every position of this {positions}-position table; "
                f"it must be < {positions}"
            )
        weight = old.weight.detach()
        kept = offset + self.keep_learned
        target = weight[kept: offset + positions]
        features = sinusoidal_table(torch.arange(self.keep_learned, positions), weight.shape[1], self.base)
        scale, fit, info = 1.0, None, {}
        if self.init == "scaled":
            scale = rms(target) / rms(features)
            info = {"scale": scale}
        elif self.init == "fit":
            fit = fit_affine(features, target, self.fit_ridge)
        module = SinusoidalPositions(weight.shape[1], rows=offset + self.max_position_embeddings, offset=offset,
                                     call=call, kept_rows=weight[:kept], base=self.base, scale=scale, fit=fit,
                                     trainable=self.trainable)
        if fit is not None:  # measured on the module itself: W and b are stored in the model's dtype
            fitted = module.table(offset + positions)[kept:].double()
            error = (fitted - target.double()).norm() / target.double().norm().clamp_min(1e-30)
            info = {"fit_relative_error": float(error)}
        return module, info

    def checkpoint_parts(self) -> tuple[str, ...]:
        # the saved table (checked against the formula below) and the fitted projection
        return ("weight", "projection.weight", "projection.bias") if self.init == "fit" else ("weight",)

    def restore_table(self, stock: nn.Embedding, *, offset: int, call: str, info: dict,
                      saved: dict[str, torch.Tensor]) -> nn.Module:
        fit = None
        if self.init == "fit":
            fit = AffineFit(weight=saved["projection.weight"].double().T, bias=saved["projection.bias"].double(),
                            relative_error=info.get("fit_relative_error", float("nan")))
        weight = stock.weight.detach()
        module = SinusoidalPositions(weight.shape[1], rows=weight.shape[0], offset=offset, call=call,
                                     kept_rows=weight[: offset + self.keep_learned], base=self.base,
                                     scale=info.get("scale", 1.0), fit=fit, trainable=self.trainable)
        # what this module would save must be what the checkpoint holds, to the precision of the coarser of
        # the dtype it was saved in and the dtype it is loaded in
        saved_table = saved["weight"].double()
        expected = module.table(weight.shape[0]).to(device="cpu", dtype=torch.float64)
        eps = max(torch.finfo(saved["weight"].dtype).eps, torch.finfo(weight.dtype).eps)
        tolerance = 2 * eps * max(1.0, float(expected.abs().max()))
        if expected.shape != saved_table.shape or not torch.allclose(saved_table, expected, rtol=0, atol=tolerance):
            deviation = float((saved_table - expected).abs().max())
            raise CheckpointMismatchError(
                f"the position table in the checkpoint is not the sinusoidal table its config records (largest "
                f"difference {deviation:.3g}): it was changed after hf_posenc saved it (trained as a learned "
                f"table?). Load it with transformers' own from_pretrained to keep that table"
            )
        return module
