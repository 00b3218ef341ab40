"""The scale each serving engine puts on cos and sin, transcribed from the engine's own source, against the scale
transformers runs for the same saved config or GGUF file: a claim of hf_posenc's about an engine that drifts from
the engine's code fails here.

Transcribed from (each function below names its file and function):
- vLLM 0.11.0 and 0.33.0 (the wheels from PyPI): vllm/model_executor/layers/rotary_embedding/__init__.py `get_rope`
  (0.11 reads the model's `rope_scaling` through transformers 4.x; phi3_long_rope_scaled_rope.py `forward`: the
  long set per batch)
  (which rope_parameters keys reach the rotary class), yarn_scaling_rope.py `YaRNScalingRotaryEmbedding.__init__`,
  phi3_long_rope_scaled_rope.py `Phi3LongRoPEScaledRotaryEmbedding.__init__`, common.py `yarn_get_mscale`;
- llama.cpp as vendored by llama-cpp-python 0.3.36 (commit 0c1e57098): src/llama-model.cpp `load_hparams`
  (rope.scaling.attn_factor read for every architecture), src/llama-context.cpp `llama_context::llama_context`
  (cparams.yarn_attn_factor), ggml/src/ggml-cpu/ops.cpp `rope_yarn` (the scale on cos and sin).
"""

from __future__ import annotations

import json
import math

import pytest

import hf_posenc as hp
from hf_posenc.export import serving
from hf_posenc.registry import METHODS
from tiny import tiny_model


# -- vLLM ------------------------------------------------------------------------------------------------
def _vllm_yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:   # common.py yarn_get_mscale
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def vllm_0_11_rope_scaling(config: dict) -> dict | None:
    """What vLLM 0.11.0 hands get_rope: the model's `config.rope_scaling` as transformers 4.x reads config.json, its
    `rope_scaling` key (4.x never reads `rope_parameters`; without the key vLLM 0.11 runs plain RoPE)."""
    return config.get("rope_scaling")


def vllm_0_11_yarn_scale(p: dict) -> float:
    """vLLM 0.11.0: get_rope passes extrapolation_factor, attn_factor, beta_fast, beta_slow of `rope_scaling`; the
    class sets mscale = yarn_get_mscale(factor) * attn_factor (attention_factor and the mscales are never read)."""
    return _vllm_yarn_get_mscale(p["factor"]) * p.get("attn_factor", 1.0)


def vllm_0_11_longrope_scale(p: dict, max_position: int, positions: list[int]) -> tuple[float, bool]:
    """vLLM 0.11.0, phi3_long_rope_scaled_rope.py: (the scale on cos and sin, whether the long set is used) for a
    batch at `positions`. get_rope passes short_mscale / long_mscale of `rope_scaling`, each defaulting to
    sqrt(1 + ln s / ln L), s = max_position / L; forward switches per batch: the long set for every token of a
    batch where any position > L (`torch.any(positions > k)`), the short set otherwise."""
    original = p["original_max_position_embeddings"]
    scale = max_position / original
    default = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))
    long = any(pos > original for pos in positions)
    return (p.get("long_mscale", default) if long else p.get("short_mscale", default)), long


def vllm_0_33_yarn_scale(p: dict) -> float:
    """vLLM 0.33.0: get_rope passes beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate (not
    attn_factor); attention_factor where given, else the mscales' ratio where both are set, else the default."""
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])
    if p.get("mscale") and p.get("mscale_all_dim"):
        return _vllm_yarn_get_mscale(p["factor"], p["mscale"]) / _vllm_yarn_get_mscale(p["factor"], p["mscale_all_dim"])
    return _vllm_yarn_get_mscale(p["factor"])


def vllm_longrope_scales(p: dict, max_position: int, max_model_len: int) -> tuple[float, float, bool]:
    """vLLM 0.33.0: (short_mscale, long_mscale, long set at every length). get_rope passes only short_mscale /
    long_mscale; each defaults to sqrt(1 + ln s / ln L), s = max_position / L, where max_position is the config's
    max_position_embeddings; the long set is used whenever max_model_len > L."""
    original = p["original_max_position_embeddings"]
    scale = max_position / original
    default = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))
    short = p.get("short_mscale", default)
    long = p.get("long_mscale", default)
    return short, long, max_model_len > original


# -- llama.cpp -------------------------------------------------------------------------------------------
def llama_cpp_scale(keys: dict, arch: str = "llama", flag: float | None = None) -> float:
    """The scale llama.cpp's rope puts on cos and sin for a GGUF file's rope keys (`--yarn-attn-factor` = flag).
    load_hparams: rope.scaling.type defaults to "linear", rope_attn_factor = rope.scaling.attn_factor or 1, every
    architecture. llama_context: yarn_attn_factor = flag, else hparams' 1; ext_factor = 1 for YaRN, 0 otherwise;
    where ext_factor != 0, yarn_attn_factor = get_mscale(factor) / (1 + 0.1 ln factor) (the flag overwritten);
    then yarn_attn_factor *= rope_attn_factor. rope_yarn: mscale = yarn_attn_factor, times 1 + 0.1 ln(1 /
    freq_scale) where ext_factor != 0."""
    kind = keys.get(f"{arch}.rope.scaling.type", "linear")
    factor = float(keys.get(f"{arch}.rope.scaling.factor", 0.0)) or 1.0
    attn = 1.0 if flag is None else flag
    if kind == "yarn":
        get_mscale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
        attn = get_mscale / (1.0 + 0.1 * math.log(factor))
    attn *= float(keys.get(f"{arch}.rope.scaling.attn_factor", 1.0))
    if kind == "yarn":
        attn *= 1.0 + 0.1 * math.log(factor)
    return attn


# Every stock RoPE method with each example of its contract, at 4x the tiny model's 64 positions, and the
# settings engines spell their own way: from the registry, so a new method is checked with nothing to edit here.
CASES = [
    (method, METHODS[method].variant_defaults(dict(example), 4 * 64, {"max_position_embeddings": 64, "rotary_dim": 16}))
    for method in serving.STOCK_METHODS for example in METHODS[method].contract.examples
] + [
    ("yarn", {"factor": 4, "attention_factor": 1.3}), ("yarn", {"factor": 4, "mscale": 0.8, "mscale_all_dim": 0.5}),
    ("yarn", {"factor": 4, "attention_factor": 1.0}),
    ("longrope", {"factor": 4, "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0], "attention_factor": 1.2}),
    ("longrope", {"factor": 4, "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0]}),
]


@pytest.mark.parametrize("method,params", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_a_saved_folder_serves_in_vllm_the_scale_transformers_runs(method, params, tmp_path):
    """The folder hp.patch saves, read as vLLM reads it: the scale vLLM's rotary class computes from its config
    equals the one transformers computes from the same config."""
    model = hp.patch(tiny_model(), method, **params)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    p = config["rope_parameters"]
    ours = float(model.model.rotary_emb.attention_scaling)
    old = vllm_0_11_rope_scaling(config)   # what 0.11 reads, through transformers 4.x
    if p["rope_type"] != "default":
        assert old is not None and old["rope_type"] == p["rope_type"]
    if p["rope_type"] == "yarn":
        assert vllm_0_11_yarn_scale(old) == pytest.approx(ours, rel=1e-6)
        assert vllm_0_33_yarn_scale(p) == pytest.approx(ours, rel=1e-6)
    elif p["rope_type"] == "longrope":
        short, long, long_always = vllm_longrope_scales(p, config["max_position_embeddings"],
                                                        config["max_position_embeddings"])
        assert short == pytest.approx(ours, rel=1e-6) and long == pytest.approx(ours, rel=1e-6)
        assert long_always   # 0.33 past the original context: the long set at every length (the static twin)
        original = p["original_max_position_embeddings"]
        for positions, wanted in ((range(original), False), (range(original + 2), True)):
            scale, long_set = vllm_0_11_longrope_scale(old, config["max_position_embeddings"], list(positions))
            assert scale == pytest.approx(ours, rel=1e-6) and long_set is wanted   # 0.11: per batch
    else:   # linear, llama3, a new base: no scale in either
        assert ours == 1.0


def test_the_vllm_transcriptions_tell_the_old_saves_apart():
    """Without the keys a patch now writes, vLLM served another scale (what the saved folders of earlier
    versions get): the transcriptions can fail."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 1.3}
    assert vllm_0_11_yarn_scale(yarn) == pytest.approx(1 + 0.1 * math.log(4))
    assert vllm_0_11_rope_scaling({"rope_parameters": yarn}) is None   # a transformers-5 save: plain RoPE in 0.11
    longrope = {"rope_type": "longrope", "original_max_position_embeddings": 8192, "attention_factor": 1.01}
    short, long, _ = vllm_longrope_scales(longrope, 32768, 32768)
    assert long == short == pytest.approx(1.0742, abs=1e-4)   # sqrt(1 + ln 4 / ln 8192), not 1.01


@pytest.mark.parametrize("params", [{"factor": 4}, {"factor": 4, "attention_factor": 1.3},
                                    {"factor": 4, "mscale": 0.8, "mscale_all_dim": 0.5}])
def test_a_yarn_gguf_serves_in_llama_cpp_the_scale_transformers_runs(params):
    model = hp.patch(tiny_model(), "yarn", **params)
    keys = serving.gguf_rope_metadata(model, "llama")
    assert llama_cpp_scale(keys) == pytest.approx(serving.rope_attention_factor(model), rel=1e-6)
    assert llama_cpp_scale(keys, flag=2.0) == llama_cpp_scale(keys)   # the flag changes nothing for YaRN


def test_a_longrope_gguf_serves_in_llama_cpp_the_scale_transformers_runs():
    for attention in (None, 1.2):
        extra = {} if attention is None else {"attention_factor": attention}
        model = hp.patch(tiny_model(), "longrope", factor=4, long_factor=[1.0, 2.0, 3.0, 4.0] * 2, **extra)
        keys = serving.gguf_rope_metadata(model, "llama")
        assert llama_cpp_scale(keys) == pytest.approx(serving.rope_attention_factor(model), rel=1e-6)


def test_llama_cpp_flags_refuse_a_yarn_scale_they_cannot_carry():
    with pytest.raises(hp.MethodNotApplicableError, match="rope.scaling.attn_factor"):
        serving.llama_cpp_args(hp.patch(tiny_model(), "yarn", factor=4, attention_factor=1.3))
    args = serving.llama_cpp_args(hp.patch(tiny_model(), "yarn", factor=4))
    assert "--yarn-attn-factor" not in args   # llama.cpp overwrites it: its own scale is the patch's
    keys = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    assert llama_cpp_scale(keys) == pytest.approx(serving.rope_attention_factor(hp.patch(tiny_model(), "yarn",
                                                                                        factor=4)))
