"""hf_posenc.analysis on tiny models: every plot writes a PNG and a CSV that holds the values computed
here from the papers' formulas (the sinusoidal table, theta_i = base^(-2i/d), cos((m - n) theta_i)), from
YaRN's rule, or from transformers' own attention weights; the checks are ~0 where the papers say the
property holds and large where it does not."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

import hf_posenc as hp
from hf_posenc import analysis
from hf_posenc.analysis import read_csv
from hf_posenc.cli import main
from hf_posenc.plan import is_patched
from tiny import tiny_model, token_ids

CTX = 64  # tiny llama's context
N = 32  # positions of the tiny learned tables
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def seed_pe(pos: int, j: int, dim: int, base: float = 10000.0) -> float:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""
    angle = pos / base ** (2 * (j // 2) / dim)
    return math.sin(angle) if j % 2 == 0 else math.cos(angle)


def seed_table(positions: int, dim: int) -> torch.Tensor:
    return torch.tensor([[seed_pe(p, j, dim) for j in range(dim)] for p in range(positions)], dtype=torch.float64)


def tiny_learned(model_type: str = "gpt2", seed: int = 0):
    torch.manual_seed(seed)
    if model_type == "gpt2":
        config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=2, n_head=2, n_positions=N, vocab_size=100,
                                      bos_token_id=0, eos_token_id=0)
        return AutoModelForCausalLM.from_config(config).eval()
    if model_type == "opt":  # its table keeps 2 rows below position 0
        config = AutoConfig.for_model("opt", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64,
                                      word_embed_proj_dim=32, max_position_embeddings=N, vocab_size=100)
        return AutoModelForCausalLM.from_config(config).eval()
    config = AutoConfig.for_model("bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=100, max_position_embeddings=N)
    return AutoModelForMaskedLM.from_config(config).eval()


def columns(data: dict, prefix: str, count: int) -> np.ndarray:
    return np.stack([data[f"{prefix}{j}"] for j in range(count)], axis=1)


def assert_png(result) -> None:
    content = result.png.read_bytes()
    assert content.startswith(PNG_MAGIC) and len(content) > 5000


def seed_inv_freq(theta: float, dim: int) -> np.ndarray:
    return np.array([theta ** (-2 * i / dim) for i in range(dim // 2)])


# -- position tables --------------------------------------------------------------------------------

def test_heat_map_of_a_sinusoidal_patch_is_the_paper_formula(tmp_path):
    model = tiny_learned("gpt2")
    result = analysis.plot_table(model, tmp_path, method="sinusoidal", init="raw", max_position_embeddings=96)
    assert_png(result)
    assert result.png.name == "table-sinusoidal.png"
    data = read_csv(result.csv)
    np.testing.assert_array_equal(data["position"], np.arange(96))
    np.testing.assert_allclose(columns(data, "dim_", 32), seed_table(96, 32).numpy(), rtol=0, atol=3e-7)
    info = json.loads(result.json.read_text())
    assert (info["positions"], info["dim"], info["original_context"]) == (96, 32, N)
    assert info["check_rotation"] < 1e-6 and info["check_relative"] < 1e-6  # float32 table
    assert not is_patched(model)  # the plot's patch is undone


def test_heat_map_of_a_learned_table_is_its_rows_past_the_offset(tmp_path):
    model = tiny_learned("opt")
    result = analysis.plot_table(model, tmp_path)
    weight = model.model.decoder.embed_positions.weight.detach().double()
    assert weight.shape[0] == N + 2
    np.testing.assert_array_equal(columns(read_csv(result.csv), "dim_", 32), weight[2:].numpy())
    info = json.loads(result.json.read_text())
    assert info["check_rotation"] > 0.5 and info["check_relative"] > 0.3  # learned: neither property holds


def test_similarity_of_the_sinusoidal_table_is_a_sum_of_cosines(tmp_path):
    dim, n = 16, 200
    result = analysis.plot_similarity({"pe": seed_table(n, dim)}, tmp_path, measure="dot", original=100)
    assert_png(result)
    data = read_csv(result.csv)
    k = np.arange(n)
    # PE(m).PE(m+k) = sum_i sin(a)sin(a + k w_i) + cos(a)cos(a + k w_i) = sum_i cos(k w_i), whatever m
    expected = np.cos(k[:, None] * seed_inv_freq(10000.0, dim)[None, :]).sum(1)
    np.testing.assert_allclose(data["pe: mean"], expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(data["pe: std"], 0, atol=1e-10)
    assert data["pe: mean"][0] == pytest.approx(dim / 2)
    assert data["pe: mean"][1:50].mean() < data["pe: mean"][0] * 0.9  # the decay the papers describe


def test_similarity_variants_of_a_learned_model(tmp_path):
    model = tiny_learned("bert")
    result = analysis.plot_similarity(model, tmp_path, max_position_embeddings=3 * N)
    data = read_csv(result.csv)
    assert len(data["distance"]) == 3 * N
    learned = data["model: mean"]
    assert np.isfinite(learned[:N]).all() and np.isnan(learned[N:]).all()  # the learned table stops at N
    assert np.isfinite(data["fit: mean"]).all() and np.isfinite(data["interpolate: mean"]).all()
    cosine = np.cos(np.arange(3 * N)[:, None] * seed_inv_freq(10000.0, 32)[None, :]).mean(1)  # |PE|^2 = d/2
    np.testing.assert_allclose(data["sinusoidal: mean"], cosine, rtol=0, atol=1e-6)
    weight = model.bert.embeddings.position_embeddings.weight.detach().double()
    unit = weight / weight.norm(dim=1, keepdim=True)
    np.testing.assert_allclose(learned[5], float((unit[:-5] * unit[5:]).sum(1).mean()), rtol=1e-9)
    assert not is_patched(model)
    with pytest.raises(hp.InvalidParameterError, match="unknown similarity variant"):
        analysis.plot_similarity(model, tmp_path, variants=["model", "spline"])


def test_table_plots_refuse_rope_models_and_learned_tables_refuse_long_reads(tmp_path):
    with pytest.raises(hp.MethodNotApplicableError, match="uses rope positions"):
        analysis.plot_table(tiny_model(), tmp_path)
    with pytest.raises(hp.SequenceTooLongError, match="holds 32 positions"):
        analysis.position_table(tiny_learned("gpt2"), 2 * N)


# -- RoPE ---------------------------------------------------------------------------------------------

def test_wavelengths_follow_the_paper_formula_and_each_method(tmp_path):
    context, s = 1024, 2.0
    model = tiny_model(max_position_embeddings=context)
    result = analysis.plot_wavelengths(model, tmp_path, methods=["linear", "ntk", "yarn"], factor=s)
    assert_png(result)
    data = read_csv(result.csv)
    theta, dim = 10000.0, 16
    wavelength = 2 * np.pi / seed_inv_freq(theta, dim)
    np.testing.assert_allclose(data["wavelength"], wavelength, rtol=1e-6)
    np.testing.assert_allclose(data["linear: stretch"], s, rtol=1e-6)
    np.testing.assert_allclose(data["ntk: inv_freq"], seed_inv_freq(theta * s ** (dim / (dim - 2)), dim), rtol=1e-5)
    # YaRN: pairs that turn more than beta_fast = 32 times in the context are kept, pairs that turn less
    # than beta_slow = 1 time are interpolated by s, the ones between get a stretch in between
    yarn = data["yarn: stretch"]
    fast, slow = wavelength < context / 32, wavelength > context / 1
    assert fast.any() and slow.any() and (~fast & ~slow).any()
    np.testing.assert_allclose(yarn[fast], 1, rtol=1e-6)
    np.testing.assert_allclose(yarn[slow], s, rtol=1e-6)
    assert ((yarn[~fast & ~slow] > 1) & (yarn[~fast & ~slow] < s)).all()
    # every column is what the patched model's own rotary module holds
    hp.patch(model, "yarn", factor=s)
    np.testing.assert_array_equal(data["yarn: inv_freq"], model.model.rotary_emb.inv_freq.double().numpy())
    hp.unpatch(model)
    info = json.loads(result.json.read_text())
    assert info["methods"]["yarn"]["attention_scaling"] == pytest.approx(0.1 * math.log(s) + 1)
    assert info["pairs_turning_inside_original_context"] == int((wavelength < context).sum())


def test_decay_is_the_mean_cosine_and_linear_stretches_it(tmp_path):
    model = tiny_model()
    result = analysis.plot_decay(model, tmp_path, methods=["linear", "yarn", "dynamic"], factor=2.0)
    assert_png(result)
    data = read_csv(result.csv)
    k = data["distance"]
    np.testing.assert_array_equal(k, np.arange(2 * CTX + 1))
    expected = np.cos(k[:, None] * seed_inv_freq(10000.0, 16)[None, :]).mean(1)
    np.testing.assert_allclose(data["none (as loaded)"], expected, rtol=0, atol=1e-6)
    # position interpolation: the score at distance 2k is the original score at distance k
    np.testing.assert_allclose(data["linear"][0::2], data["none (as loaded)"][: CTX + 1], rtol=0, atol=1e-6)
    assert data["yarn"][0] == pytest.approx((0.1 * math.log(2) + 1) ** 2, rel=1e-6)  # cos/sin scaled by mscale
    assert not np.allclose(data["dynamic"], data["none (as loaded)"])  # read at the target length: rescaled


def test_rope_plots_refuse_learned_models_and_patched_models(tmp_path):
    with pytest.raises(hp.MethodNotApplicableError, match="not RoPE"):
        analysis.plot_wavelengths(tiny_learned("gpt2"), tmp_path)
    model = hp.patch(tiny_model(), "linear", factor=2.0)
    with pytest.raises(hp.AlreadyPatchedError, match="already patched"):
        analysis.plot_decay(model, tmp_path)


# -- attention ------------------------------------------------------------------------------------

def reference_profile(attentions, queries: int) -> np.ndarray:
    """Per layer and distance d: mean over heads and the last `queries` queries i (with i - d >= 0) of
    the weight on key i - d, written as plain loops over transformers' own attention weights."""
    layers, (_, heads, length, _) = len(attentions), attentions[0].shape
    out = np.full((layers, length), np.nan)
    for layer, weights in enumerate(attentions):
        for d in range(length):
            values = [float(weights[0, h, i, i - d]) for h in range(heads)
                      for i in range(length - queries, length) if i - d >= 0]
            if values:
                out[layer, d] = sum(values) / len(values)
    return out


def test_attention_profile_matches_the_models_own_weights(tmp_path):
    model = tiny_model()
    ids = token_ids(2 * CTX)
    result = analysis.plot_attention(model, ids[0], tmp_path, lengths=[40, 2 * CTX], methods=["yarn", "dynamic_yarn"],
                                     queries=8)
    assert_png(result)
    assert model.config._attn_implementation == "sdpa" and not is_patched(model)  # both put back
    data = read_csv(result.csv)
    eager = tiny_model()
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        for length in (40, 2 * CTX):
            reference = reference_profile(eager(ids[:, :length], output_attentions=True).attentions, queries=8)
            for layer in range(2):
                got = data[f"as loaded; {length} tokens; layer {layer}"][:length]
                np.testing.assert_allclose(got, reference[layer], rtol=1e-5, atol=1e-7)
    # inside the original context dynamic_yarn is the unpatched model; yarn is not
    for layer in range(2):
        before = data[f"as loaded; 40 tokens; layer {layer}"]
        np.testing.assert_array_equal(data[f"patched: dynamic_yarn; 40 tokens; layer {layer}"], before)
        assert not np.allclose(data[f"patched: yarn; 40 tokens; layer {layer}"][:40], before[:40])
    info = json.loads(result.json.read_text())
    assert info["lengths"] == [40, 2 * CTX] and info["skipped"] == {}


def test_attention_refuses_a_length_whose_weights_the_machine_cannot_hold(tmp_path, monkeypatch):
    """Eager attention at 99999 tokens asked the allocator for 40 GB: a RuntimeError traceback deep in the forward
    (or, just under the machine's memory, the OOM killer). Refused before the pass, naming what it would need."""
    import psutil

    model = tiny_model()
    heads = model.config.num_attention_heads
    free = 2 * heads * 40 ** 2 * 4 + 1   # room for 40 tokens, not for 41
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": free})())
    assert analysis.attention_profile(model, token_ids(40)[0], queries=4).shape[0] == 2
    with pytest.raises(hp.InvalidParameterError, match=rf"41 tokens: eager attention holds {heads} heads x 41 x 41 "
                                                       rf"weights per layer .* use shorter lengths"):
        analysis.plot_attention(model, token_ids(64)[0], tmp_path, lengths=[41], queries=4)
    assert not any(tmp_path.iterdir())


def test_attention_skips_lengths_past_a_learned_table(tmp_path):
    model = tiny_learned("bert")
    result = analysis.plot_attention(model, token_ids(2 * N, vocab=100)[0], tmp_path, methods="interpolate",
                                     queries=4)  # default lengths: N / 2 inside, 2N past the table
    info = json.loads(result.json.read_text())
    assert info["lengths"] == [N // 2, 2 * N]
    assert list(info["skipped"]) == [f"as loaded, {2 * N} tokens"] and "holds 32 positions" in info["skipped"][
        f"as loaded, {2 * N} tokens"]
    data = read_csv(result.csv)
    assert np.isfinite(data[f"patched: interpolate; {2 * N} tokens; layer 1"][: 2 * N]).all()
    with pytest.raises(hp.InvalidParameterError, match="the text has 10 tokens"):
        analysis.plot_attention(model, token_ids(10, vocab=100)[0], tmp_path, lengths=[16])


# -- checks --------------------------------------------------------------------------------------------

def test_toeplitz_residual_against_a_direct_computation():
    scores = torch.arange(20.0, dtype=torch.float64).reshape(4, 5) ** 1.5
    projected = scores.clone()
    for offset in range(-3, 5):
        cells = [(m, m + offset) for m in range(4) if 0 <= m + offset < 5]
        mean = sum(float(scores[c]) for c in cells) / len(cells)
        for c in cells:
            projected[c] = mean
    expected = float((scores - projected).norm() / scores.norm())
    assert analysis.toeplitz_residual(scores) == pytest.approx(expected, rel=1e-12)
    assert analysis.toeplitz_residual(torch.tensor([[1.0, 2, 3], [0, 1, 2], [5, 7, 1]])) > 0.1
    assert analysis.toeplitz_residual(torch.tensor([[1.0, 2, 3], [0, 1, 2], [7, 0, 1]])) < 1e-15


class BrokenRotary(torch.nn.Module):
    """A rotary module that turns pair i by m^2 * theta_i: not a function of m - n."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.register_buffer("inv_freq", torch.tensor(seed_inv_freq(10000.0, dim), dtype=torch.float32))

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() ** 2 * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()


def test_check_relative_is_zero_for_rope_and_sinusoid_and_large_for_learned():
    model = tiny_model()
    assert analysis.check_relative(model) < 1e-5  # float32 angles
    assert analysis.check_relative(model.model.rotary_emb) < 1e-5
    for method in ("yarn", "dynamic"):
        hp.patch(model, method, factor=4.0)
        assert analysis.check_relative(model, length=4 * CTX) < 1e-4
        hp.unpatch(model)
    assert analysis.check_relative(BrokenRotary(), length=64) > 0.1
    assert analysis.check_relative(seed_table(300, 32)) < 1e-12
    learned = tiny_learned("gpt2")
    assert analysis.check_relative(learned) > 0.3
    assert analysis.check_relative(learned.transformer.wpe) > 0.3
    hp.patch(learned, "sinusoidal", init="raw", max_position_embeddings=4 * N)
    assert analysis.check_relative(learned) < 1e-6


def test_check_rotation_is_zero_for_the_sinusoid_and_large_for_learned():
    dim = 16
    table = seed_table(256, dim)
    assert analysis.check_rotation(table) < 1e-12
    for k in (1, 5, 100):
        fit = analysis.rotation_fit(table, k)
        expected = np.array([k * 10000.0 ** (-2 * i / dim) for i in range(dim // 2)])
        wrapped = (expected + np.pi) % (2 * np.pi) - np.pi
        np.testing.assert_allclose(fit.angles.numpy(), wrapped, rtol=0, atol=1e-9)
        assert fit.relative_residual < 1e-12
    assert analysis.check_rotation(seed_table(256, 17)) < 1e-12  # the odd last column has no pair
    assert analysis.check_rotation(tiny_learned("gpt2")) > 0.5
    # a shift that depends on the position is no rotation
    warped = torch.tensor([[seed_pe(p + 0.01 * p * p, j, dim) for j in range(dim)] for p in range(256)])
    assert analysis.check_rotation(warped) > 0.1


# -- command line and optional matplotlib ------------------------------------------------------------------

def test_cli_plots_a_rope_and_a_learned_checkpoint(tmp_path, capsys):
    rope_dir, learned_dir = tmp_path / "rope", tmp_path / "learned"
    tiny_model().save_pretrained(rope_dir)
    tiny_learned("bert").save_pretrained(learned_dir)
    main(["plot", str(rope_dir), "--what", "wavelengths,decay", "--method", "linear,yarn",
          "--max-position-embeddings", "256", "--out", str(tmp_path / "out")])
    main(["plot", str(learned_dir), "--what", "table", "--method", "interpolate", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    for name in ("wavelengths", "decay", "table", "table-interpolate"):
        assert (tmp_path / "out" / f"{name}.png").stat().st_size > 5000, name
        assert f"{name}.png" in printed
    assert read_csv(tmp_path / "out" / "table-interpolate.csv")["position"].tolist() == list(range(2 * N))
    for argv, message in ((["--what", "similarity"], "does not apply to this llama model's rope positions"),
                          (["--what", "decay", "--method", "yarnn"], "unknown method 'yarnn'")):
        with pytest.raises(SystemExit) as exit_:  # one line `error: ...`, exit code 2
            main(["plot", str(rope_dir), *argv, "--out", str(tmp_path / "out")])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_plots_need_matplotlib_and_the_checks_do_not(tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'hf_posenc\[plot\]'"):
        analysis.plot_similarity({"pe": seed_table(20, 8)}, tmp_path)
    with pytest.raises(ImportError, match="need matplotlib"):  # before any forward pass
        analysis.plot_attention(tiny_model(), token_ids(8)[0], tmp_path, lengths=[4])
    assert not any(tmp_path.iterdir())
    assert analysis.check_rotation(seed_table(20, 8)) < 1e-12
    assert analysis.similarity_profile(seed_table(20, 8))["mean"][0] == pytest.approx(1.0)


# -- the embedded real models (no plots: the numbers) ----------------------------------------------------

@pytest.mark.real
def test_real_checks_on_the_embedded_models():
    from hf_posenc import assets

    try:
        minilm_path, smollm2_path = assets.minilm_dir(), assets.smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    minilm = hp.load_model(minilm_path).eval()
    assert analysis.check_relative(minilm) > 0.3 and analysis.check_rotation(minilm) > 0.5  # a learned table
    hp.patch(minilm, "sinusoidal", init="raw", max_position_embeddings=1024)
    assert analysis.check_relative(minilm) < 1e-6 and analysis.check_rotation(minilm) < 1e-6
    smollm2 = hp.load_model(smollm2_path).eval()
    assert analysis.check_relative(smollm2, length=2048) < 1e-4  # float32 angles up to 2047 * theta_0
    wavelengths = analysis.rope_frequencies(smollm2).wavelength
    assert int((wavelengths < 8192).sum()) == 20  # of 32 pairs, theta 1e5: the rest never turn once in 8k
