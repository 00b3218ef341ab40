"""llama.cpp export of a model with one RoPE per attention type: Gemma-3 patched on its
full-attention layers. llama.cpp's gemma3 loader keeps the sliding layers at their own base and scale
(src/llama-model.cpp: rope_freq_base_train_swa / rope_freq_scale_train_swa for LLM_ARCH_GEMMA3,
get_rope_freq_base / get_rope_freq_scale per layer), so its flags and GGUF rope keys reach the full-attention
layers only: the export equals what a model with one RoPE of the full-attention layers' settings gets, and
the sliding layers' own settings are left as they are."""

from __future__ import annotations

import math

import numpy as np
import pytest

import hf_posenc as hp
from hf_posenc.export import serving
from test_serving import write_tiny_gguf
from tiny import tiny_model

gguf = pytest.importorskip("gguf")

FULL_THETA = 1e6  # transformers' Gemma-3 defaults: full-attention layers at 1e6, sliding layers at 1e4
SLIDING = {"rope_type": "default", "rope_theta": 10000.0}
CASES = [("yarn", {"factor": 4}), ("linear", {"factor": 2}), ("ntk", {"factor": 4}), ("base", {"theta": 5e6})]


def gemma3(**overrides):
    return tiny_model("gemma3_text", layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                      **overrides)


def single(**overrides):
    """A model with one RoPE: the Gemma-3 full-attention layers' settings for all layers."""
    return tiny_model("llama", rope_parameters={"rope_type": "default", "rope_theta": FULL_THETA}, **overrides)


@pytest.mark.parametrize("method,params", CASES, ids=[m for m, _ in CASES])
def test_llama_cpp_flags_equal_the_single_rope_models(method, params):
    model = hp.patch(gemma3(), method, **params)
    assert model.config.rope_parameters["sliding_attention"] == SLIDING  # the patch leaves them
    args = serving.llama_cpp_args(model)
    assert args == serving.llama_cpp_args(hp.patch(single(), method, **params))
    flags = dict(zip(args[::2], args[1::2]))
    assert float(flags["--rope-freq-base"]) != SLIDING["rope_theta"]  # the full-attention layers' base
    if method == "yarn":  # llama.cpp sets the scale itself (no flag): 1 on the sliding layers, its YaRN one on the rest
        assert "--yarn-attn-factor" not in flags


@pytest.mark.parametrize("method,params", CASES, ids=[m for m, _ in CASES])
def test_gguf_metadata_equals_the_single_rope_models(method, params):
    ours = serving.gguf_rope_metadata(hp.patch(gemma3(), method, **params), "gemma3")
    assert ours == serving.gguf_rope_metadata(hp.patch(single(), method, **params), "gemma3")
    assert not any("swa" in key or "sliding" in key for key in ours)


def write_gemma3_gguf(path, theta=FULL_THETA):
    """A small gemma3-architecture GGUF with its sliding-window keys (and a swa rope base, which some llama.cpp
    architectures read): a float tensor and a raw Q8_0 block."""
    def sliding(writer):
        writer.add_float32("gemma3.rope.freq_base_swa", 10000.0)
        writer.add_uint32("gemma3.attention.sliding_window", 16)

    return write_tiny_gguf(path, theta, arch="gemma3", keys=sliding)


def test_write_gguf_changes_the_rope_keys_only(tmp_path):
    source = write_gemma3_gguf(tmp_path / "in.gguf")
    model = hp.patch(gemma3(), "yarn", factor=4)
    written = serving.write_gguf(model, source, tmp_path / "out.gguf")
    assert written == serving.gguf_rope_metadata(hp.patch(single(), "yarn", factor=4), "gemma3")
    rope = serving.read_gguf_rope(tmp_path / "out.gguf")
    assert rope["rope.scaling.type"] == "yarn" and rope["rope.scaling.factor"] == 4.0
    assert rope["rope.freq_base"] == FULL_THETA and rope["rope.scaling.original_context_length"] == 64
    before, after = gguf.GGUFReader(source), gguf.GGUFReader(tmp_path / "out.gguf")
    for key, field in before.fields.items():  # the sliding layers' keys (and every other) as they were
        if key not in written and not key.startswith("GGUF."):
            assert after.fields[key].contents() == field.contents(), key
    assert after.fields["gemma3.rope.freq_base_swa"].contents() == 10000.0
    assert after.fields["gemma3.attention.sliding_window"].contents() == 16
    for a, b in zip(before.tensors, after.tensors):
        assert a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data)


def test_an_unpatched_model_needs_no_flags():
    assert serving.llama_cpp_args(gemma3()) == []


@pytest.mark.parametrize("params, pattern", [
    ({"factor": 4, "layer_types": ["sliding_attention", "full_attention"]}, r"rescales the sliding layers"),
    ({"factor": 4, "attention_factor": 1.3}, r"multiplies every layer's cos and sin by one attention scale"),
])
def test_what_llama_cpp_would_apply_to_the_sliding_layers_is_refused(params, pattern, tmp_path):
    model = hp.patch(gemma3(), "yarn", **params)
    with pytest.raises(hp.MethodNotApplicableError, match=pattern):
        serving.llama_cpp_args(model)
    with pytest.raises(hp.MethodNotApplicableError, match=pattern):
        serving.write_gguf(model, write_gemma3_gguf(tmp_path / "in.gguf"), tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_an_architecture_whose_loader_takes_one_rope_is_refused(tmp_path):
    """A llama-architecture file: llama.cpp would rescale every layer, the sliding ones included."""
    writer = gguf.GGUFWriter(tmp_path / "llama.gguf", arch="llama")
    writer.add_context_length(64)
    writer.add_rope_freq_base(FULL_THETA)
    writer.add_tensor("token_embd.weight", np.zeros((4, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(hp.MethodNotApplicableError, match="one RoPE for all layers of a llama model"):
        serving.write_gguf(hp.patch(gemma3(), "yarn", factor=4), tmp_path / "llama.gguf", tmp_path / "out.gguf")


def test_llama_cpps_own_yarn_scale_is_the_full_attention_layers():
    """llama.cpp's own YaRN scale 0.1 ln s + 1 (it takes no flag for it) is the one transformers computes for the
    full-attention layers."""
    model = hp.patch(gemma3(), "yarn", factor=8)
    flags = dict(zip(*[iter(serving.llama_cpp_args(model))] * 2))
    full = serving.yarn_attention_factor(model, "full_attention")
    assert float(flags["--rope-scale"]) == 8 and 1 + 0.1 * math.log(8) == pytest.approx(full, rel=1e-6)
