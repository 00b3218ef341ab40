"""`hierarchical` (Su 2020's hierarchical decomposition of a learned table) on every learned-table family:
the formula against a reference written here, the original rows kept bit for bit, long inputs, save ->
stock transformers and hp.from_pretrained, and the refusals."""

from __future__ import annotations

import pytest
import torch

import hf_posenc as hp
from hf_posenc.methods.hierarchical import hierarchical_rows
from hf_posenc.methods.learned import LearnedPositions
from hf_posenc.plan import is_patched

from test_learned import FAMILIES, N, TINY, inputs, logits, tables, tiny


def reference(p: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    """Su 2020, position k = i n + j: alpha u_i + (1 - alpha) u_j, u_i = (p_i - alpha p_0) / (1 - alpha)."""
    n = p.shape[0]
    i, j = divmod(k, n)
    u = lambda m: (p[m] - alpha * p[0]) / (1 - alpha)  # noqa: E731
    return alpha * u(i) + (1 - alpha) * u(j)


@pytest.mark.parametrize("alpha", [0.4, 0.1, 0.9])
def test_rows_follow_the_formula_and_keep_the_first_n_exactly(alpha):
    torch.manual_seed(0)
    p = torch.randn(7, 5, dtype=torch.float64)
    grown = hierarchical_rows(p, 49, alpha)
    assert grown.shape == (49, 5) and torch.equal(grown[:7], p)
    for k in range(49):
        torch.testing.assert_close(grown[k], reference(p, k, alpha), rtol=1e-12, atol=1e-12)
    # block i repeats the learned rows, moved by alpha (u_i - u_0)
    torch.testing.assert_close(grown[14:21] - p, (alpha / (1 - alpha) * (p[2] - p[0])).expand(7, 5))


def test_rows_in_float32_and_bfloat16_keep_the_original_rows_bit_for_bit():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        p = torch.randn(16, 8).to(dtype)
        grown = hierarchical_rows(p, 100, 0.4)
        assert grown.dtype == dtype and torch.equal(grown[:16], p)
        expected = torch.stack([reference(p.double(), k, 0.4) for k in range(100)]).to(dtype)
        assert torch.equal(grown[16:], expected[16:])  # float64 arithmetic, one rounding


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_keeps_its_table_and_runs_past_it(model_type):
    model = tiny(model_type)
    batch = inputs(model, N, batch=2, pad=5)
    reference_logits = logits(model, batch)
    old = [t.weight.detach().clone() for t in tables(model)]
    hp.patch(model, "hierarchical", factor=4)
    new = tables(model)
    assert all(isinstance(t, LearnedPositions) for t in new)
    for before, after in zip(old, new):  # rows below position 0 and the n learned rows: the same bits
        assert torch.equal(after.weight[: before.shape[0]], before)
        assert after.weight.shape[0] == before.shape[0] + 3 * N
    assert torch.equal(logits(model, batch), reference_logits)  # inside the table: the model as it was
    model.train()
    long = inputs(model, 4 * N, batch=2, pad=3)
    out = model(**long, labels=long["input_ids"])
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(t.weight.grad is not None for t in tables(model))  # trainable
    model.eval()
    hp.unpatch(model)
    assert torch.equal(logits(model, batch), reference_logits)


@pytest.mark.parametrize("model_type", ["gpt2", "roberta", "bart", "opt", "distilbert"])
def test_save_loads_in_stock_transformers_and_hf_posenc(tmp_path, model_type):
    model = tiny(model_type)
    hp.patch(model, "hierarchical", factor=3, alpha=0.3)
    within = inputs(model, 3 * N, batch=2, pad=3)
    patched = logits(model, within)
    model.save_pretrained(tmp_path)

    stock = TINY[model_type][0].from_pretrained(tmp_path).eval()  # the materialised table, a plain table
    assert all(type(t) is not LearnedPositions for t in tables(stock))
    assert torch.equal(logits(stock, within), patched)

    restored = hp.from_pretrained(tmp_path).eval()
    assert hp.describe(restored)["method"] == "hierarchical" and hp.describe(restored)["params"]["alpha"] == 0.3
    assert all(isinstance(t, LearnedPositions) for t in tables(restored))
    assert torch.equal(logits(restored, within), patched)
    hp.unpatch(restored)
    assert not is_patched(restored) and torch.equal(logits(restored, within), patched)


def test_the_target_stops_at_n_squared_and_longer_inputs_are_refused():
    model = tiny("gpt2")
    hp.patch(model, "hierarchical", max_position_embeddings=N * N)
    assert hp.describe(model)["length_limit"] == N * N
    hp.unpatch(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(hp.InvalidParameterError, match=rf"n\^2 = {N * N}.*<= {N * N}"):
        hp.patch(model, "hierarchical", max_position_embeddings=N * N + 1)
    assert not is_patched(model) and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("alpha,pattern", [
    (0.5, "alpha=0.5 makes position"), (1.0, r"alpha must be in \(0, 1\)"), (0, "alpha must be > 0"),
    (-0.2, "alpha must be > 0"), ("0.4", "alpha must be a number"), (float("nan"), "alpha must be finite"),
])
def test_bad_alpha_is_refused_before_anything_changes(alpha, pattern):
    model = tiny("bert")
    with pytest.raises((hp.InvalidParameterError, hp.ParameterTypeError), match=pattern):
        hp.patch(model, "hierarchical", factor=2, alpha=alpha)
    assert not is_patched(model)


def test_rope_models_are_refused_naming_the_methods_that_apply():
    from tiny import tiny_model

    with pytest.raises(hp.MethodNotApplicableError, match="applies to learned positions"):
        hp.patch(tiny_model(), "hierarchical", factor=2)

