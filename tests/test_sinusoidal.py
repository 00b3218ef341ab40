"""The math of hf_posenc.methods.sinusoidal and .learned against references written here: the paper's
formula element by element, the rotation property, plain least squares, the interpolation formula."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_posenc.methods.interpolate import interpolate_rows
from hf_posenc.methods.learned import table_rows
from hf_posenc.methods.tile import tile_rows
from hf_posenc.methods.sinusoidal import SinusoidalPositions, fit_affine, sinusoidal_table


def paper_formula(pos: int, j: int, dim: int, base: float = 10000.0) -> float:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)), written out."""
    i = j // 2
    angle = pos / base ** (2 * i / dim)
    return math.sin(angle) if j % 2 == 0 else math.cos(angle)


@pytest.mark.parametrize("dim,base", [(16, 10000.0), (7, 10000.0), (12, 500.0)])
def test_table_is_the_paper_formula(dim, base):
    positions = [0, 1, 2, 5, 63, 1000, 123456]
    table = sinusoidal_table(torch.tensor(positions), dim, base)
    expected = torch.tensor([[paper_formula(p, j, dim, base) for j in range(dim)] for p in positions],
                            dtype=torch.float64)
    assert table.shape == (len(positions), dim)
    torch.testing.assert_close(table, expected, rtol=0, atol=1e-12)
    # and in float32, what the models use, to float32 precision
    torch.testing.assert_close(table.float(), expected.float(), rtol=0, atol=2e-7)


@settings(max_examples=60, deadline=None)
@given(pos=st.integers(0, 50_000), k=st.integers(-2_000, 2_000), dim=st.sampled_from([2, 8, 64, 65]))
def test_shift_by_k_is_a_rotation_of_each_pair(pos, k, dim):
    """PE(pos + k) = R(beta_i) PE(pos) in every pair i, beta_i = k / 10000^(2i/d), R independent of pos."""
    table = sinusoidal_table(torch.tensor([pos, pos + k]), dim)
    now, shifted = table[0], table[1]
    for i in range(dim // 2):
        beta = k / 10000 ** (2 * i / dim)
        rotation = torch.tensor([[math.cos(beta), math.sin(beta)], [-math.sin(beta), math.cos(beta)]],
                                dtype=torch.float64)
        pair = now[2 * i: 2 * i + 2]
        torch.testing.assert_close(rotation @ pair, shifted[2 * i: 2 * i + 2], rtol=0, atol=1e-9)


def test_fit_recovers_an_exact_affine_map():
    torch.manual_seed(0)
    features = sinusoidal_table(torch.arange(200), 16)
    weight, bias = torch.randn(16, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    rows = features @ weight + bias
    fit = fit_affine(features, rows, ridge=0.0)
    assert fit.relative_error < 1e-9
    torch.testing.assert_close(features @ fit.weight + fit.bias, rows, rtol=0, atol=1e-9)


def test_fit_is_least_squares_and_ridge_shrinks_it():
    torch.manual_seed(0)
    features = sinusoidal_table(torch.arange(100), 8)
    rows = torch.randn(100, 8, dtype=torch.float64)
    fit = fit_affine(features, rows, ridge=0.0)
    # reference: least squares on [features, 1]
    design = torch.cat([features, torch.ones(100, 1, dtype=torch.float64)], dim=1)
    reference = torch.linalg.lstsq(design, rows).solution
    # the fitted values are unique even where the low-frequency columns make W ill-conditioned
    torch.testing.assert_close(features @ fit.weight + fit.bias, design @ reference, rtol=0, atol=1e-8)
    torch.testing.assert_close(fit.weight, reference[:-1], rtol=1e-5, atol=1e-8)
    expected_error = (design @ reference - rows).norm() / rows.norm()
    assert fit.relative_error == pytest.approx(float(expected_error), rel=1e-9)
    shrunk = fit_affine(features, rows, ridge=1.0)
    assert shrunk.weight.norm() < fit.weight.norm()
    assert shrunk.relative_error > fit.relative_error


def test_interpolation_reads_the_old_table_at_the_scaled_position():
    torch.manual_seed(0)
    old = torch.randn(10, 4)
    new = interpolate_rows(old, 37)
    for p in range(37):
        x = p * (10 - 1) / (37 - 1)
        low, frac = int(math.floor(x)), x - math.floor(x)
        high = min(low + 1, 9)
        expected = old[low].double() * (1 - frac) + old[high].double() * frac
        torch.testing.assert_close(new[p].double(), expected, rtol=0, atol=1e-6)
    assert torch.equal(new[0], old[0]) and torch.equal(new[-1], old[-1])
    assert torch.equal(interpolate_rows(old, 10), old)  # factor 1: bit for bit


def test_tiling_repeats_the_rows():
    old = torch.arange(12.0).view(4, 3)
    new = tile_rows(old, 10)
    assert torch.equal(new, old[[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]])


def test_table_rows_follow_each_call_style():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    # OPT: attended tokens count from 0, padding reads position -1, offset 2 on top
    assert table_rows("mask", 2, mask).tolist() == [[1, 1, 2, 3, 4], [2, 3, 4, 1, 1]]
    assert table_rows("mask", 2, mask, past_key_values_length=3).tolist() == [[3, 4], [1, 1]]
    ids = torch.zeros(2, 3, dtype=torch.long)
    assert table_rows("arange", 2, ids, past_key_values_length=4).tolist() == [[6, 7, 8], [6, 7, 8]]
    assert table_rows("arange", 2, ids, 0, torch.tensor([5, 6, 7])).tolist() == [[7, 8, 9]]
    assert table_rows("ids", 0, torch.tensor([[3, 4]])).tolist() == [[3, 4]]


def _module(init: str, trainable: bool = False, offset: int = 2) -> SinusoidalPositions:
    torch.manual_seed(0)
    dim, kept = 8, torch.randn(offset, 8)
    fit = None
    if init == "fit":
        fit = fit_affine(sinusoidal_table(torch.arange(20), dim), torch.randn(20, dim), ridge=0.1)
    return SinusoidalPositions(dim, rows=offset + 20, offset=offset, call="ids", kept_rows=kept,
                               scale=0.5 if init == "scaled" else 1.0, fit=fit, trainable=trainable)


def test_module_rows_are_kept_rows_then_the_formula():
    module = _module("scaled")
    rows = torch.tensor([[0, 1, 2, 3, 100]])  # 100: past the cache, which grows
    out = module(rows)[0]
    torch.testing.assert_close(out[:2], module.kept_rows)
    expected = 0.5 * sinusoidal_table(torch.tensor([0, 1, 98]), 8).float()
    torch.testing.assert_close(out[2:], expected, rtol=0, atol=1e-6)


def test_module_fit_rows_and_state_dict():
    module = _module("fit")
    w, b = module.projection.weight.detach().double().T, module.projection.bias.detach().double()
    out = module(torch.tensor([5, 40]))
    expected = sinusoidal_table(torch.tensor([3, 38]), 8) @ w + b
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
    state = module.state_dict()
    assert set(state) == {"weight", "projection.weight", "projection.bias"}
    assert state["weight"].shape == (22, 8)
    torch.testing.assert_close(state["weight"], module(torch.arange(22)))
    # loading a state dict brings the kept rows and the projection, and refreshes the cache
    other = _module("fit")
    with torch.no_grad():
        other.projection.weight.mul_(2)
        other.kept_rows.zero_()
    other(torch.arange(22))  # cache filled with the changed values
    other.load_state_dict(state)
    torch.testing.assert_close(other(torch.arange(22)), module(torch.arange(22)))  # inside the cache
    torch.testing.assert_close(other(torch.arange(60)), module(torch.arange(60)))  # past it


def test_trainable_projection_learns_and_the_cache_follows():
    module = _module("fit", trainable=True)
    rows = torch.arange(2, 22)  # inside the cache filled at construction
    out = module(rows)
    assert out.requires_grad
    out.pow(2).sum().backward()
    assert module.projection.weight.grad is not None and module.projection.weight.grad.abs().sum() > 0
    torch.optim.SGD(module.parameters(), lr=0.1).step()
    with torch.no_grad():
        cached = module(rows)  # the no-grad path reads the cache: it must see the step
    torch.testing.assert_close(cached, module(rows).detach(), rtol=0, atol=1e-6)
