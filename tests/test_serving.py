"""Export for serving engines: vLLM's overrides read back by transformers itself, llama.cpp's flags,
GGUF metadata written and read back with the gguf library; bad arguments to them, and GGUF files or exports the
GGUF keys cannot say, refused in one line (hp.write_gguf and `patch X.gguf --out Y.gguf` from the header alone)."""

from __future__ import annotations

import copy
import math
import struct

import numpy as np
import pytest
import torch
from transformers import AutoConfig

import hf_posenc as hp
from hf_posenc import cli, loading
from hf_posenc.export import serving
from hf_posenc.registry import METHODS
from refusals import GGUF_PATCH, cache, gguf_refusal, ggufs, refused_as, snapshot  # noqa: F401 (fixtures)
from tiny import tiny_config, tiny_model

gguf = pytest.importorskip("gguf")

# Every stock RoPE method with each example of its contract (hf_posenc.config.Contract), completed at 4x the tiny
# Llama's context as an evaluation variant is: from the registry, so a new one is in these checks with nothing to
# edit here. Then settings engines spell their own way: YaRN's attention factor and mscale, a base given as theta.
STOCK_CASES = [
    (method, METHODS[method].variant_defaults(dict(example), 4 * 64, {"max_position_embeddings": 64, "rotary_dim": 16}))
    for method in serving.STOCK_METHODS for example in METHODS[method].contract.examples
] + [
    ("base", {"theta": 5e5}), ("yarn", {"factor": 4, "attention_factor": 1.3, "beta_fast": 16}),
    ("yarn", {"factor": 4, "mscale": 0.8, "mscale_all_dim": 0.5}),
    ("longrope", {"factor": 4, "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0]}),
]


def rotary_of(model):
    return model.model.rotary_emb


def build_rotary(config):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("method,params", STOCK_CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_overrides_make_transformers_build_the_patched_rotary(method, params):
    model = hp.patch(tiny_model(), method, **params)
    overrides = serving.serving_overrides(model)
    config = copy.deepcopy(tiny_config())  # the original checkpoint's config, as an engine reads it
    config.update(overrides)                # what vLLM's --hf-overrides does
    ours, theirs = rotary_of(model), build_rotary(config)
    torch.testing.assert_close(theirs.inv_freq, ours.inv_freq, rtol=0, atol=0)
    assert theirs.attention_scaling == pytest.approx(ours.attention_scaling, rel=1e-7)
    assert config.max_position_embeddings == model.config.max_position_embeddings
    if method == "yarn":  # spelled out, so an engine's own default cannot differ
        assert overrides["rope_parameters"]["attention_factor"] == pytest.approx(ours.attention_scaling)
    if method == "longrope":  # vLLM reads LongRoPE's scale from these two keys only (its own default otherwise)
        params = overrides["rope_parameters"]
        assert params["short_mscale"] == params["long_mscale"] == pytest.approx(ours.attention_scaling)


@pytest.mark.parametrize("method,params", STOCK_CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_legacy_overrides_read_by_transformers_as_a_v4_config(method, params):
    model = hp.patch(tiny_model(), method, **params)
    legacy = serving.serving_overrides(model, legacy=True)
    assert "rope_parameters" not in legacy
    kwargs = {k: v for k, v in tiny_config().to_dict().items() if k not in ("rope_parameters", "model_type")}
    config = AutoConfig.for_model("llama", **{**kwargs, **legacy})
    ours, theirs = rotary_of(model), build_rotary(config)
    torch.testing.assert_close(theirs.inv_freq, ours.inv_freq, rtol=0, atol=0)
    assert theirs.attention_scaling == pytest.approx(ours.attention_scaling, rel=1e-7)


def test_unpatched_needs_no_overrides_and_other_methods_are_refused():
    assert serving.serving_overrides(tiny_model()) == {} and serving.llama_cpp_args(tiny_model()) == []
    for method, params in [("dynamic", {"factor": 2}), ("dynamic_yarn", {"factor": 2}), ("alibi", {})]:
        model = hp.patch(tiny_model(), method, **params)
        with pytest.raises(hp.MethodNotApplicableError, match=f"{method!r} cannot be exported to vLLM"):
            serving.serving_overrides(model)
        with pytest.raises(hp.MethodNotApplicableError, match="llama.cpp"):
            serving.llama_cpp_args(model)
    for method, params in [("llama3", {"factor": 4}), ("longrope", {"factor": 4, "long_factor": [2.0] * 8})]:
        with pytest.raises(hp.MethodNotApplicableError, match=f"rope_type {method!r}, whose per-pair factors no flag "
                                                             f"carries; write them into a GGUF file"):
            serving.llama_cpp_args(hp.patch(tiny_model(), method, **params))


@pytest.mark.parametrize("method", serving.STOCK_METHODS)
def test_the_command_lines_llama_cpp_list_follows_what_each_method_saves(method):
    """The CLI checks a method against llama.cpp before loading a model: the rope_type it asks each method for
    is the one a patched model saves, and the method is on the list exactly when llama.cpp takes that model."""
    params = dict(next((p for m, p in STOCK_CASES if m == method)))
    model = tiny_model("llama")
    hp.patch(model, method, **params)
    saved = model.config.rope_parameters["rope_type"]
    assert serving._written_rope_type(serving.METHODS[method]) == saved
    assert (method in serving.LLAMA_CPP_METHODS) == (saved in serving.LLAMA_CPP_ROPE_TYPES)
    if method in serving.LLAMA_CPP_METHODS:
        hp.llama_cpp_args(model)
    else:
        with pytest.raises(hp.MethodNotApplicableError):
            hp.llama_cpp_args(model)


def test_llama_cpp_flags_spell_yarn_in_llama_cpps_terms():
    model = hp.patch(tiny_model(), "yarn", factor=4, beta_fast=16)
    args = serving.llama_cpp_args(model)
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["--rope-scaling"] == "yarn" and float(flags["--rope-scale"]) == 4
    assert flags["--yarn-orig-ctx"] == "64" and flags["--ctx-size"] == "256"
    assert float(flags["--yarn-beta-fast"]) == 16 and float(flags["--yarn-beta-slow"]) == 1
    # llama.cpp overwrites --yarn-attn-factor with its own 0.1 ln s + 1 (tests/test_engine_formulas.py): no flag,
    # and a patch with another scale is sent to the GGUF key that carries it
    assert "--yarn-attn-factor" not in flags
    with pytest.raises(hp.MethodNotApplicableError, match="rope.scaling.attn_factor"):
        serving.llama_cpp_args(hp.patch(tiny_model(), "yarn", factor=4, attention_factor=1.3))
    ntk = serving.llama_cpp_args(hp.patch(tiny_model(), "ntk", factor=4))
    assert float(ntk[1]) == pytest.approx(10000 * 4 ** (16 / 14), rel=1e-6) and "--rope-scaling" not in ntk


def write_tiny_gguf(path, theta=10000.0, *, arch="llama", keys=lambda writer: None):
    """A small GGUF (llama architecture unless `arch`): a float tensor and a raw Q8_0 block, plus the usual
    keys and what `keys(writer)` adds."""
    writer = gguf.GGUFWriter(path, arch=arch)
    writer.add_context_length(64)
    writer.add_rope_freq_base(theta)
    keys(writer)
    writer.add_block_count(2)
    writer.add_string("general.name", "tiny")
    writer.add_array("general.languages", ["en", "fr"])
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(4, 16))
    q8 = np.arange(34 * 2, dtype=np.uint8).reshape(2, 34)  # two Q8_0 blocks of 32 weights, as raw bytes
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("method,params,expected", [
    ("yarn", {"factor": 4}, {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                             "rope.scaling.original_context_length": 64, "context_length": 256}),
    ("linear", {"factor": 2}, {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0, "context_length": 128}),
    ("ntk", {"factor": 2}, {"rope.freq_base": pytest.approx(10000 * 2 ** (16 / 14), rel=1e-6), "context_length": 128}),
])
def test_gguf_round_trip(tmp_path, method, params, expected):
    source = write_tiny_gguf(tmp_path / "in.gguf")
    model = hp.patch(tiny_model(), method, **params)
    serving.write_gguf(model, source, tmp_path / "out.gguf")
    rope = serving.read_gguf_rope(tmp_path / "out.gguf")
    assert {k: rope[k] for k in expected} == expected
    before, after = gguf.GGUFReader(source), gguf.GGUFReader(tmp_path / "out.gguf")
    changed = {f"llama.{k}" for k in expected} | {"llama.rope.freq_base"}
    for key, field in before.fields.items():  # every other key kept as it was
        if key not in changed and not key.startswith("GGUF."):
            assert after.fields[key].contents() == field.contents(), key
    assert [t.name for t in after.tensors] == [t.name for t in before.tensors]
    for a, b in zip(before.tensors, after.tensors):  # byte for byte, quantized types kept
        assert a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data)


def converter_llama3_factors(theta: float, dim: int, factor: float, original: int, low: float = 1.0,
                             high: float = 4.0) -> list[float]:
    """llama.cpp's converter's rope_freqs for a llama3 config (its LlamaModel.generate_extra_tensors), as a
    reference written from its formula: 1 below the high-frequency wavelength, the factor above the low one, a
    smooth blend between."""
    out = []
    for i in range(0, dim, 2):
        wavelength = 2 * math.pi * theta ** (i / dim)
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


@pytest.mark.parametrize("method,params", [
    ("longrope", {"long_factor": [1.0, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0], "attention_factor": 1.05}),
    ("longrope", {"long_factor": [1.2] * 8, "short_factor": [1.2] * 8}),        # a static set, default scale
    ("llama3", {}),
])
def test_gguf_carries_per_pair_factors_as_llama_cpp_reads_them_and_loads_back_the_same_model(tmp_path, method, params):
    source = write_tiny_gguf(tmp_path / "in.gguf")
    model = hp.patch(tiny_model(), method, max_position_embeddings=256, **params)
    written = serving.write_gguf(model, source, tmp_path / "out.gguf")
    rope = serving.read_gguf_rope(tmp_path / "out.gguf")
    after = {t.name: t for t in gguf.GGUFReader(tmp_path / "out.gguf").tensors}
    assert rope["context_length"] == 256 and rope["rope.scaling.original_context_length"] == 64
    assert "rope.scaling.factor" not in rope   # llama.cpp would divide every angle by it on top of the tensors
    if method == "longrope":
        saved = model.config.rope_parameters
        assert rope["rope.scaling.type"] == "longrope" and "rope_freqs.weight" not in after
        assert after["rope_factors_long.weight"].data.tolist() == pytest.approx(saved["long_factor"])
        assert after["rope_factors_short.weight"].data.tolist() == pytest.approx(saved["short_factor"])
        assert rope["rope.scaling.attn_factor"] == pytest.approx(rotary_of(model).attention_scaling)
    else:   # as llama.cpp's converter writes llama3: rope_freqs, no type key
        assert "rope.scaling.type" not in rope and "rope_factors_long.weight" not in after
        assert after["rope_freqs.weight"].data.tolist() == pytest.approx(converter_llama3_factors(10000.0, 16, 4, 64),
                                                                         rel=1e-5)
    assert {t.tensor_type for n, t in after.items() if n in serving.FACTOR_TENSORS} == {gguf.GGMLQuantizationType.F32}
    assert set(written) >= {n for n in after if n in serving.FACTOR_TENSORS}
    before = gguf.GGUFReader(source)
    for tensor in before.tensors:   # the model's own tensors byte for byte
        assert np.array_equal(after[tensor.name].data, tensor.data)
    # read back: the file's patch is the same model, inside the original context and past it
    found, back = serving.gguf_patch(tmp_path / "out.gguf")
    assert found == "longrope"
    loaded = hp.patch(tiny_model(), found, **{k: v for k, v in back.items() if k != "original_max_position_embeddings"})
    for n in (48, 200):
        ids = torch.arange(n)[None] % 128
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=2e-5, rtol=1e-4)


def test_a_yarn_scale_travels_in_the_gguf_key_llama_cpp_multiplies_and_loads_back(tmp_path):
    source = write_tiny_gguf(tmp_path / "in.gguf")
    model = hp.patch(tiny_model(), "yarn", factor=4, attention_factor=1.3)
    serving.write_gguf(model, source, tmp_path / "out.gguf")
    rope = serving.read_gguf_rope(tmp_path / "out.gguf")
    assert rope["rope.scaling.attn_factor"] * (1 + 0.1 * math.log(4)) == pytest.approx(1.3, rel=1e-6)
    kind, params = serving.gguf_patch(tmp_path / "out.gguf")
    assert kind == "yarn" and params["attention_factor"] == pytest.approx(1.3, rel=1e-6)


def write_rope_freqs_gguf(path, *, original: int | None, values=None):
    """A llama GGUF with `rope_freqs.weight` (as llama.cpp's converter writes Llama 3.x), the original context
    written or not."""
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_context_length(256)
    writer.add_rope_freq_base(10000.0)
    if original is not None:
        writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_tensor("rope_freqs.weight", np.asarray(values or [1.0, 1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0],
                                                      dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_rope_freqs_without_the_original_context_loads_as_llama_cpp_runs_it(tmp_path):
    """llama.cpp divides every pair by rope_freqs.weight at every length, with or without the original context:
    one static set (before: loaded unscaled, `inspect` said default)."""
    kind, params = serving.gguf_patch(write_rope_freqs_gguf(tmp_path / "a.gguf", original=None))
    assert kind == "longrope" and params["long_factor"] == params["short_factor"] == [1, 1, 2, 3, 4, 4, 4, 4]
    assert params["original_max_position_embeddings"] == params["max_position_embeddings"] == 256


def test_an_attn_factor_with_no_scaling_type_is_refused_naming_the_key(tmp_path):
    path = write_tiny_gguf(tmp_path / "a.gguf", keys=lambda w: w.add_rope_scaling_attn_factors(1.2))
    with pytest.raises(hp.InvalidInputError, match="rope.scaling.attn_factor is 1.2"):
        serving.gguf_patch(path)


def test_any_patch_onto_a_file_with_factor_tensors_is_refused(tmp_path):
    """llama.cpp would apply the old tensor beside a new base (ntk) as beside new factors."""
    freqs = write_rope_freqs_gguf(tmp_path / "freqs.gguf", original=64)
    for method in ("ntk", "base"):
        params = {"factor": 2} if method == "ntk" else {"theta": 5e4}
        with pytest.raises(serving.ExportError, match="already holds rope_freqs.weight"):
            serving.write_gguf(hp.patch(tiny_model(), method, **params), freqs, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_gguf_factor_exports_refuse_what_llama_cpp_would_not_read(tmp_path):
    longrope = hp.patch(tiny_model(), "longrope", factor=4, long_factor=[2.0] * 8)
    qwen = write_tiny_gguf(tmp_path / "qwen.gguf", arch="qwen2")
    with pytest.raises(hp.MethodNotApplicableError, match="llama.cpp's qwen2 loader reads no longrope factor tensors"):
        serving.write_gguf(longrope, qwen, tmp_path / "a.gguf")
    held = write_tiny_gguf(tmp_path / "held.gguf", keys=lambda w: None)
    writer = gguf.GGUFWriter(tmp_path / "freqs.gguf", arch="llama")
    writer.add_context_length(64)
    writer.add_rope_freq_base(10000.0)
    writer.add_tensor("rope_freqs.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(serving.ExportError, match="already holds rope_freqs.weight"):
        serving.write_gguf(longrope, tmp_path / "freqs.gguf", tmp_path / "b.gguf")
    assert not (tmp_path / "a.gguf").exists() and not (tmp_path / "b.gguf").exists() and held.exists()


def test_gguf_export_refusals_write_nothing(tmp_path):
    source = write_tiny_gguf(tmp_path / "in.gguf")
    original = source.read_bytes()
    cases = [
        (hp.patch(tiny_model(), "yarn", factor=4, beta_fast=16), tmp_path / "a.gguf", {}, "beta_fast"),
        (hp.patch(tiny_model(), "dynamic", factor=2), tmp_path / "b.gguf", {}, "cannot be exported to GGUF"),
        (hp.patch(tiny_model(), "yarn", factor=4), source, {"overwrite": True}, "the input file"),
        (hp.patch(tiny_model(), "yarn", factor=4), tmp_path, {}, "a folder"),
        (hp.patch(tiny_model(rope_theta=5e5), "yarn", factor=4), tmp_path / "c.gguf", {}, "not the file"),
        (tiny_model(), tmp_path / "d.gguf", {}, "no hf_posenc patch"),
    ]
    for model, target, kwargs, message in cases:
        with pytest.raises(hp.PosEncError, match=message):
            serving.write_gguf(model, source, target, **kwargs)
    (tmp_path / "e.gguf").write_text("not a gguf")
    with pytest.raises(serving.ExportError, match="exists"):
        serving.write_gguf(hp.patch(tiny_model(), "yarn", factor=4), source, tmp_path / "e.gguf")
    with pytest.raises(serving.ExportError, match="not a readable GGUF"):
        serving.write_gguf(hp.patch(tiny_model(), "yarn", factor=4), tmp_path / "e.gguf", tmp_path / "f.gguf")
    # a string array claiming 2^60 elements: gguf's own reader would hang on it
    corrupt = original.replace(struct.pack("<IQ", 8, 2), struct.pack("<IQ", 8, 2**60), 1)
    assert corrupt != original
    (tmp_path / "g.gguf").write_bytes(corrupt)
    with pytest.raises(serving.ExportError, match="not a readable GGUF.*do not fit"):
        serving.write_gguf(hp.patch(tiny_model(), "yarn", factor=4), tmp_path / "g.gguf", tmp_path / "f.gguf")
    wide = write_tiny_gguf(tmp_path / "wide.gguf", keys=lambda writer: writer.add_rope_dimension_count(64))
    with pytest.raises(serving.ExportError, match="rotates 64 dimensions of each head, this model 16"):
        serving.write_gguf(hp.patch(tiny_model(), "longrope", long_factor=[2.0] * 8, factor=4), wide, tmp_path / "h")
    for junk in (None, torch.nn.Linear(2, 2)):
        with pytest.raises(hp.PosEncError, match="takes the transformers model patched from the file"):
            serving.write_gguf(junk, source, tmp_path / "i.gguf")
    assert source.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.gguf", "g.gguf", "in.gguf", "wide.gguf"]


def test_a_folder_where_a_gguf_file_is_read_is_refused_as_a_folder(tmp_path, capsys):
    """`--vocab-from FOLDER` (and a folder as write_gguf's source) said "GGUF file not found" of a path that is
    there."""
    from hf_posenc.cli import main
    from hf_posenc.export.gguf_writer import write_gguf_model
    from refusals import one_line_refusal
    from tiny import TINY_TEXT_VOCAB, save_text_models

    model = hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB), "yarn", factor=4)
    save_text_models(tmp_path, saved=model)
    (tmp_path / "vocab").mkdir()
    for call, says in [(lambda: serving.write_gguf(model, tmp_path / "vocab", tmp_path / "a.gguf"), "the input file"),
                       (lambda: write_gguf_model(model, tmp_path / "a.gguf", vocab_from=tmp_path / "vocab"),
                        "the vocab_from file")]:
        with pytest.raises(serving.ExportError) as refusal:
            call()
        assert str(refusal.value) == f"{tmp_path / 'vocab'} is a folder, and {says} must be a GGUF file: name the " \
                                     f".gguf file"
    line = one_line_refusal(capsys, main, ["export", str(tmp_path / "saved"), "--out", str(tmp_path / "a.gguf"),
                                           "--vocab-from", str(tmp_path / "vocab")], alone=True)
    assert line == f"error: {tmp_path / 'vocab'} is a folder, and the vocab_from file must be a GGUF file: name " \
                   f"the .gguf file"
    assert not (tmp_path / "a.gguf").exists()


@pytest.mark.real
def test_smollm2_gguf_export(tmp_path):
    from hf_posenc import assets

    source = assets.smollm2_gguf()
    model = hp.patch(hp.load_model(source), "yarn", max_position_embeddings=16384)
    serving.write_gguf(model, source, tmp_path / "smollm2-16k.gguf")
    rope = serving.read_gguf_rope(tmp_path / "smollm2-16k.gguf")
    assert rope["rope.scaling.type"] == "yarn" and rope["rope.scaling.factor"] == 2.0
    assert rope["rope.scaling.original_context_length"] == 8192 and rope["context_length"] == 16384
    assert rope["rope.freq_base"] == 100000.0
    assert len(gguf.GGUFReader(tmp_path / "smollm2-16k.gguf").tensors) == 272


@pytest.mark.real
def test_a_scaled_gguf_loads_patched(tmp_path):
    """transformers reads a GGUF file's context and rope base, not its rope scaling: hf_posenc restores it."""
    from hf_posenc import assets

    source = assets.smollm2_gguf()
    original = hp.load_model(source).eval()
    patched = hp.patch(hp.load_model(source), "yarn", max_position_embeddings=16384).eval()
    serving.write_gguf(patched, source, tmp_path / "smollm2-16k.gguf")
    assert serving.gguf_patch(tmp_path / "smollm2-16k.gguf") == (
        "yarn", {"max_position_embeddings": 16384, "original_max_position_embeddings": 8192})
    assert serving.gguf_patch(source) is None
    loaded = hp.load_model(tmp_path / "smollm2-16k.gguf", cache=False).eval()
    info = hp.describe(loaded)
    assert (info["method"], info["factor"], info["max_position_embeddings"]) == ("yarn", 2.0, 16384)
    skeleton = hp.describe(loading.meta_model(tmp_path / "smollm2-16k.gguf"))  # what `hf-posenc inspect` shows
    assert {k: skeleton[k] for k in ("method", "factor", "max_position_embeddings")} == {
        k: info[k] for k in ("method", "factor", "max_position_embeddings")}
    assert loaded.config.rope_parameters == patched.config.rope_parameters
    ids = torch.arange(100, 164)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, patched(ids).logits)
        assert not torch.allclose(loaded(ids).logits, original(ids).logits)


@pytest.mark.real
def test_cli_patch_writes_a_gguf_and_refuses_what_gguf_cannot_say(tmp_path, capsys):
    from hf_posenc import assets
    from hf_posenc.cli import main

    source = assets.smollm2_gguf()
    main(["patch", str(source), "--method", "linear", "--factor", "2", "--out", str(tmp_path / "x2.gguf")])
    assert "--rope-scaling linear" in capsys.readouterr().out
    rope = serving.read_gguf_rope(tmp_path / "x2.gguf")
    assert (rope["rope.scaling.type"], rope["rope.scaling.factor"], rope["context_length"]) == ("linear", 2.0, 16384)
    for argv, out, message in [
        (["--method", "dynamic", "--factor", "2"], "d.gguf", "cannot be written into a GGUF file"),
        (["--method", "linear", "--factor", "2"], "x2.gguf", "exists; pass --overwrite"),
        (["--method", "linear", "--factor", "2"], str(source), "is the input file"),
    ]:
        with pytest.raises(SystemExit) as refused:
            main(["patch", str(source), *argv, "--out", str(tmp_path / out)])
        assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "d.gguf").exists()
    # per-pair factors: tensors in the file, no llama.cpp flags to print; the file loads back as the same model
    main(["patch", str(source), "--method", "llama3", "--factor", "2", "--out", str(tmp_path / "l3.gguf")])
    out = capsys.readouterr().out
    assert f"llama-server -m {tmp_path / 'l3.gguf'} -c 16384" in out and "from the original file" not in out
    # YaRN with its own scale: the key is in the file, no flag can say it: exit 0, the command that serves the file
    main(["patch", str(source), "--method", "yarn", "--factor", "2", "--param", "attention_factor=1.3", "--out",
          str(tmp_path / "y.gguf")])
    out = capsys.readouterr().out
    assert f"llama-server -m {tmp_path / 'y.gguf'} -c 16384" in out and "from the original file" not in out
    assert serving.read_gguf_rope(tmp_path / "y.gguf")["rope.scaling.attn_factor"] == pytest.approx(
        1.3 / (0.1 * math.log(2) + 1), rel=1e-6)
    loaded = hp.load_model(tmp_path / "l3.gguf", cache=False).eval()
    assert hp.describe(loaded)["method"] == "longrope"
    patched = hp.patch(hp.load_model(source), "llama3", factor=2).eval()
    ids = torch.arange(300)[None] * 7 % 1000
    torch.testing.assert_close(loaded(ids).logits, patched(ids).logits, atol=1e-4, rtol=1e-4)
    folder = tmp_path / "folder"
    hp.patch(tiny_model(), "linear", factor=2).save_pretrained(folder)
    with pytest.raises(SystemExit):
        main(["patch", str(folder), "--method", "linear", "--factor", "2", "--out", str(tmp_path / "z.gguf")])
    assert "written from a GGUF input" in capsys.readouterr().err and not (tmp_path / "z.gguf").exists()


def llama_cpp_group_distances(length: int, group: int, block: int) -> np.ndarray:
    """The distance RoPE sees between query i and key j <= i under llama.cpp's group attention (llama-completion's
    --grp-attn-n G --grp-attn-w W loop: before a token is decoded, every full block of W tokens before it has its
    cached positions divided by G, and the tokens after them moved back by W - W/G), decoding one token at a time,
    in the builds whose divided keys sit at floor(j / G). A reference of its position arithmetic, from its code."""
    shift = block - block // group
    out = np.zeros((length, length), dtype=np.int64)
    for i in range(length):
        grouped = i // block                                  # blocks grouped before token i is decoded
        query = i - grouped * shift
        for j in range(i + 1):
            key = j // group if j < grouped * block else j - grouped * shift
            out[i, j] = query - key
    return out


def self_extend_distances(length: int, group: int, window: int) -> np.ndarray:
    """Self-Extend's distances (Jin et al. 2024, hf_posenc/methods/self_extend.py): true within the window,
    floor(i / G) - floor(j / G) + W - floor(W / G) beyond it."""
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    grouped = i // group - j // group + window - window // group
    return np.where(i - j < window, i - j, grouped) * (j <= i)


def test_llama_cpp_group_attention_is_not_self_extend_so_no_flags_are_given():
    """For every group size and block llama.cpp takes (one that fills inside the input: otherwise neither groups
    anything) and every window Self-Extend takes, some query and key are at other distances: the two mappings
    differ, and the export says why instead of giving flags."""
    length = 64
    for group in (2, 4):
        for block in range(group, length, group):   # llama.cpp: W a multiple of G; a block that fills inside the input
            theirs = llama_cpp_group_distances(length, group, block)
            assert all((self_extend_distances(length, group, window) != theirs).any()
                       for window in range(1, length)), (group, block)
    model = hp.patch(tiny_model(), "self_extend", group_size=2, window=16)
    with pytest.raises(hp.MethodNotApplicableError, match="--grp-attn-n / --grp-attn-w.*different mapping"):
        hp.llama_cpp_args(model)


def test_dca_export_names_the_vllm_releases_that_ran_it_and_why_not_this_patch():
    model = hp.patch(tiny_model("qwen2"), "dca", max_position_embeddings=256)
    with pytest.raises(hp.MethodNotApplicableError, match=r"dual_chunk_attention_config only up to 0\.10.*qwen2.*"
                                                          r"length scale|0\.1 ln\(length / original\) \+ 1"):
        hp.serving_overrides(model)


def test_a_config_edited_after_the_patch_is_not_exported_as_the_model():
    """hp.patch(yarn x4), then model.config.rope_parameters["factor"] = 8 by hand: every export reads the config,
    which no longer says what the model runs; refused instead of serving another model."""
    model = hp.patch(tiny_model(), "yarn", factor=4)
    assert serving.serving_overrides(model)["rope_parameters"]["factor"] == 4.0
    model.config.rope_parameters["factor"] = 8.0
    for export in (serving.serving_overrides, serving.llama_cpp_args,
                   lambda m: serving.gguf_rope_metadata(m, "llama")):
        with pytest.raises(hp.PosEncError, match="config was edited after its patch"):
            export(model)


@pytest.mark.parametrize("key, value, says", [("long_factor", [2.0] * 5, "long_factor has 5 values"),
                                              ("short_factor", [1.0] * 9, "short_factor has 9 values"),
                                              ("long_factor", "2.0", "long_factor is '2.0'")])
def test_a_longrope_factor_list_edited_to_another_length_is_refused_naming_the_key_and_the_length(
        tmp_path, key, value, says):
    """LongRoPE's long_factor edited in model.config to 5 values (the tiny Llama has 8 rotary pairs) ended in
    transformers' RuntimeError ("The size of tensor a (5) must match ...") inside hp.write_gguf."""
    source = write_tiny_gguf(tmp_path / "in.gguf")
    model = hp.patch(tiny_model(), "longrope", factor=4, long_factor=[2.0] * 8)
    model.config.rope_parameters[key] = value
    for export in (lambda m: hp.write_gguf(m, source, tmp_path / "out.gguf"), serving.serving_overrides):
        with pytest.raises(hp.MethodNotApplicableError) as refusal:
            export(model)
        assert f"the model's rope_parameters {says}; it must be a list of 8 numbers, one per rotary pair (half the " \
               f"rotary dimension 16)" in str(refusal.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.gguf"]


@pytest.mark.parametrize("model_type, method", [("gemma3_text", "yarn"), ("gemma3_text", "ntk"), ("olmo3", "yarn")])
def test_a_rope_per_layer_type_saved_with_4x_keys_reads_back_the_same_in_transformers_5(model_type, method, tmp_path):
    """The family keys written for transformers 4.x (rope_theta, rope_scaling, rope_local_base_freq) are also read
    by transformers 5, which takes rope_scaling into the full layers' parameters: the saved folder loads back with
    the rope_parameters the patch made, each layer type's rotary alike."""
    import json

    model = tiny_model(model_type, layer_types=["sliding_attention", "full_attention"])
    hp.patch(model, method, max_position_embeddings=256)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_theta"] == model.config.rope_parameters["full_attention"]["rope_theta"]
    back = hp.from_pretrained(tmp_path)
    assert back.config.rope_parameters == model.config.rope_parameters
    ids = torch.arange(200)[None]
    for layer_type in ("sliding_attention", "full_attention"):
        with torch.no_grad():
            want = model.model.rotary_emb(torch.zeros(1, 1), ids, layer_type)
            got = back.model.rotary_emb(torch.zeros(1, 1), ids, layer_type)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# -- bad arguments to the serving functions, in one line -----------------------------------------------------------

def _yarn():
    return hp.patch(tiny_model(), "yarn", factor=4)


API_CASES = [
    ("overrides-legacy-str", lambda: serving.serving_overrides(_yarn(), legacy="no"), hp.ParameterTypeError,
     r"legacy must be a bool, got 'no'"),
    ("overrides-legacy-int", lambda: serving.serving_overrides(_yarn(), legacy=1), hp.ParameterTypeError,
     r"legacy must be a bool, got 1"),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_public_functions_refuse_bad_arguments(call, error, pattern):
    refused_as(call, error, pattern)


def test_legacy_flag_still_picks_the_format():
    assert "rope_scaling" in serving.serving_overrides(_yarn(), legacy=True)
    assert "rope_parameters" in serving.serving_overrides(_yarn(), legacy=False)


# -- GGUF files: what a file's rope scaling keys or an export cannot say, refused in one line from the header --------

# (id, argv, the error line, refused before the weights load)
GGUF_CASES = [
    ("inspect-yarn-without-factor", ["inspect", "{root}/nofactor.gguf"],
     r"nofactor\.gguf: the GGUF key rope\.scaling\.factor is None; yarn rope scaling needs a positive number", True),
    ("inspect-factor-a-string", ["inspect", "{root}/strfactor.gguf"],
     r"the GGUF key rope\.scaling\.factor is 'four'", True),
    ("patch-gguf-param-gguf-cannot-say", [*GGUF_PATCH, "--param", "beta_fast=16", "--out", "{root}/o.gguf"],
     r"a GGUF file cannot make llama\.cpp use this YaRN patch's \{'beta_fast': 16\}", True),
]


@pytest.mark.parametrize("argv,pattern,early", [c[1:] for c in GGUF_CASES], ids=[c[0] for c in GGUF_CASES])
def test_gguf_refusals_are_one_line_and_the_header_decides_first(argv, pattern, early, ggufs, cache, capsys,
                                                                 monkeypatch):
    gguf_refusal(argv, pattern, early, ggufs, cache, capsys, monkeypatch)


def test_patch_gguf_to_gguf_still_writes(ggufs, cache, tmp_path, capsys):
    cli.main([*[a.format(root=ggufs) for a in GGUF_PATCH], "--out", str(tmp_path / "x2.gguf")])
    rope = serving.read_gguf_rope(tmp_path / "x2.gguf")
    assert rope["rope.scaling.type"] == "yarn" and rope["context_length"] == 128


# -- hp.write_gguf: the cheap checks before the whole file is read -----------------------------------------------

WRITE_GGUF_CASES = [
    ("folder-missing", {"factor": 4}, "no/such/dir/o.gguf", {},
     r"the output's folder .*no/such/dir does not exist; create the folder first"),
    ("folder-a-file", {"factor": 4}, "taken.gguf/o.gguf", {}, r"the output's folder .*taken\.gguf is a file"),
    ("target-a-folder", {"factor": 4}, "folder.gguf", {"overwrite": True}, r"folder\.gguf is a folder"),
    ("betas-gguf-cannot-say", {"factor": 4, "beta_fast": 16}, "o.gguf", {}, r"cannot make llama\.cpp use .*beta_fast"),
    ("other-rope-base", {"factor": 4, "rope_theta": 5e5}, "o.gguf", {}, r"not the file this model was loaded from"),
]


@pytest.mark.parametrize("params,target,kwargs,pattern", [c[1:] for c in WRITE_GGUF_CASES],
                         ids=[c[0] for c in WRITE_GGUF_CASES])
def test_write_gguf_refuses_from_the_header_alone(params, target, kwargs, pattern, ggufs, monkeypatch):
    theta = params.pop("rope_theta", 10000.0)
    model = hp.patch(tiny_model(rope_theta=theta, hidden_size=16, num_attention_heads=2, head_dim=8,
                                num_key_value_heads=1), "yarn", **params)
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: pytest.fail("the whole file was read"))
    before = snapshot(ggufs)
    with pytest.raises(hp.PosEncError, match=pattern):
        hp.write_gguf(model, ggufs / "good.gguf", ggufs / target, **kwargs)
    assert snapshot(ggufs) == before
