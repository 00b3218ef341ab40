"""hp.patched (a patch for one `with` block) against hp.patch / hp.unpatch, the embedded models' names
(smollm2, minilm) in hp.load_model / hp.load_tokenizer, as the command line takes them, and bad input as a hostile
new user would give it: each case names the call, the error class and what its message must say, and checks that
nothing changed (the model's tensors and config, the files on disk). Then the behaviours those cases led to:
unpatch after hp.from_pretrained, numpy / torch parameters that save, a PEFT-wrapped model, a patch in the middle
of training."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from refusals import (Case, assert_same_model, build, model_state, refused_as, refused_clearly_and_unchanged, saved,
                      stacked, without_original_table)
from safetensors.torch import load_file
from test_learned import tiny
from tiny import GPT2_POSITIONS as N
from tiny import gpt2, logits, tiny_model, token_ids
from torch import nn
from transformers import AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc import _compat, assets
from hf_posenc import eval as hpe
from hf_posenc.methods.learned import ORIGINAL_TABLE
from hf_posenc.plan import is_patched


def snapshot(model, ids: torch.Tensor) -> tuple:
    """What an exact restore must give back: the config, the module tree, every tensor and the logits."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        logits = model(ids).logits
    return model.config.to_dict(), [(n, type(m)) for n, m in model.named_modules()], state, logits


def assert_restored(model, before: tuple, ids: torch.Tensor) -> None:
    config, modules, state, logits = snapshot(model, ids)
    assert (config, modules) == before[:2]
    assert state.keys() == before[2].keys() and all(torch.equal(state[k], before[2][k]) for k in state)
    assert torch.equal(logits, before[3])


def test_patched_is_the_patch_inside_the_block_and_the_original_after():
    model, reference = tiny_model(), tiny_model()
    ids = token_ids(96)  # past the 64-token context
    before = snapshot(model, ids)
    hp.patch(reference, "yarn", max_position_embeddings=256)
    with hp.patched(model, "yarn", max_position_embeddings=256) as inside, torch.no_grad():
        assert inside is model
        assert hp.describe(model) == hp.describe(reference)
        patched_logits = model(ids).logits
        assert torch.equal(patched_logits, reference(ids).logits)
    assert not torch.allclose(patched_logits, before[3])  # the block did run a different model
    assert hp.describe(model)["method"] is None
    assert_restored(model, before, ids)


def test_patched_restores_the_model_when_the_block_raises():
    model = tiny_model()
    ids = token_ids(16)
    before = snapshot(model, ids)
    with pytest.raises(RuntimeError, match="inside the block"):
        with hp.patched(model, hp.configs.YarnConfig(factor=4)):
            assert hp.describe(model)["method"] == "yarn"
            raise RuntimeError("inside the block")
    assert hp.describe(model)["method"] is None
    assert_restored(model, before, ids)


def test_patched_refuses_as_patch_does_and_leaves_the_model_alone():
    model = tiny_model()
    with pytest.raises(hp.InvalidParameterError):
        with hp.patched(model, "yarn", factor=-1):
            pytest.fail("the block must not run")
    assert hp.describe(model)["method"] is None
    with hp.patched(model, "linear", factor=2):
        with pytest.raises(hp.AlreadyPatchedError):  # nested: refused, as hp.patch on a patched model
            with hp.patched(model, "yarn", factor=2):
                pytest.fail("the block must not run")
        assert hp.describe(model)["method"] == "linear"  # the refusal left the outer patch in place
    assert hp.describe(model)["method"] is None


def test_patched_stacks_where_patch_does_and_peels_only_its_own_patch():
    model = tiny("gpt2")
    ids = token_ids(20, vocab=97) + 3
    hp.patch(model, "rope", theta=100.0)  # learned -> rope: RoPE methods stack on it
    before = snapshot(model, ids)
    with hp.patched(model, "yarn", factor=2):
        assert hp.describe(model)["method"] == "yarn"
    assert hp.describe(model)["method"] == "rope"
    assert_restored(model, before, ids)
    hp.unpatch(model)
    assert hp.describe(model)["method"] is None


def test_after_the_block_the_model_is_as_before_whatever_the_block_patched():
    model = tiny_model()
    ids = token_ids(16)
    before = snapshot(model, ids)
    with hp.patched(model, "ntk", factor=2):
        hp.unpatch(model)
        hp.patch(model, "linear", factor=2)
    assert_restored(model, before, ids)
    with hp.patched(model, "ntk", factor=2):
        hp.unpatch(model)  # nothing left to undo: no error at the end of the block
    assert_restored(model, before, ids)


def test_the_variant_helper_is_patched_with_the_variant_parameters():
    model = tiny_model()
    with hpe.variant(model, "yarn beta_fast=16", 256) as params:
        assert params == {"beta_fast": 16, "max_position_embeddings": 256}
        assert hp.describe(model)["params"]["beta_fast"] == 16
    assert hp.describe(model)["method"] is None
    with pytest.raises(RuntimeError), hpe.variant(model, "ntk", 256):
        raise RuntimeError
    assert hp.describe(model)["method"] is None


# -- the embedded models' names ---------------------------------------------------------------------

def asset(fn):
    try:
        return str(fn())
    except FileNotFoundError as err:
        pytest.skip(str(err))


@pytest.mark.real
def test_load_tokenizer_takes_the_embedded_names():
    text = "To be, or not to be, that is the question."
    for alias, fn in assets.ALIASES.items():
        by_name, by_path = hp.load_tokenizer(alias), hp.load_tokenizer(asset(fn))
        assert by_name(text)["input_ids"] == by_path(text)["input_ids"]


@pytest.mark.real
def test_load_model_takes_the_embedded_names():
    for alias, fn in assets.ALIASES.items():
        by_name, by_path = hp.load_model(alias), hp.load_model(asset(fn))
        assert type(by_name) is type(by_path) and by_name.config.to_dict() == by_path.config.to_dict()
        assert all(torch.equal(a, b) for a, b in zip(by_name.state_dict().values(), by_path.state_dict().values()))


def test_an_alias_whose_asset_is_missing_says_how_to_install_it(monkeypatch):
    def missing():
        raise FileNotFoundError("the offline asset package 'x' is not installed; install it with: pip install x")

    monkeypatch.setitem(assets.ALIASES, "smollm2", missing)
    with pytest.raises(hp.ModelNotFoundError, match="'smollm2' names an embedded model.*pip install x"):
        hp.load_model("smollm2")


# -- bad input to hp.patch, hp.unpatch, hp.describe and hp.check_length: refused clearly, nothing changed -----------

P = hp.patch
CASES = [
    # what is not a model
    Case("patch-nn-linear", lambda c: P(nn.Linear(2, 2), "yarn", factor=2), hp.UnsupportedModelError,
         "needs a transformers model"),
    Case("patch-a-name", lambda c: P("llama", "yarn", factor=2), hp.UnsupportedModelError, "hp.load_model('llama')"),
    Case("patch-none", lambda c: P(None, "yarn", factor=2), hp.UnsupportedModelError, "got NoneType"),
    Case("unpatch-a-name", lambda c: hp.unpatch("x"), hp.UnsupportedModelError, "hp.unpatch needs a transformers"),
    Case("unpatch-none", lambda c: hp.unpatch(None), hp.UnsupportedModelError, "hp.unpatch needs a transformers"),
    Case("unpatch-nn-linear", lambda c: hp.unpatch(nn.Linear(2, 2)), hp.UnsupportedModelError, "got Linear"),
    Case("describe-a-name", lambda c: hp.describe("x"), hp.UnsupportedModelError, "hp.describe needs"),
    Case("describe-nn-linear", lambda c: hp.describe(nn.Linear(2, 2)), hp.UnsupportedModelError, "hp.describe needs"),
    Case("check-length-a-name", lambda c: hp.check_length("x", 3), hp.UnsupportedModelError, "hp.check_length needs"),
    # numbers
    Case("factor-nan", lambda c: P(c.model, "yarn", factor=float("nan")), hp.InvalidParameterError,
         "factor must be finite", "llama"),
    Case("factor-inf", lambda c: P(c.model, "yarn", factor=float("inf")), hp.InvalidParameterError,
         "factor must be finite", "llama"),
    Case("factor-negative", lambda c: P(c.model, "yarn", factor=-1), hp.InvalidParameterError, "factor must be > 0",
         "llama"),
    Case("factor-below-1", lambda c: P(c.model, "yarn", factor=0.5), hp.InvalidParameterError, "factor must be >= 1",
         "llama"),
    Case("factor-1e30", lambda c: P(c.model, "yarn", factor=1e30), hp.InvalidParameterError,
         "it must be <= 2147483647", "llama"),
    Case("factor-1e308-overflow", lambda c: P(c.model, "linear", factor=1e308), hp.InvalidParameterError,
         "a context of inf tokens", "llama"),
    Case("factor-str", lambda c: P(c.model, "yarn", factor="2"), hp.ParameterTypeError, "factor must be a number",
         "llama"),
    Case("factor-bool", lambda c: P(c.model, "yarn", factor=True), hp.ParameterTypeError, "got True (bool)", "llama"),
    Case("factor-list", lambda c: P(c.model, "yarn", factor=[2]), hp.ParameterTypeError, "factor must be a number",
         "llama"),
    Case("factor-two-element-tensor", lambda c: P(c.model, "yarn", factor=torch.tensor([2.0, 3.0])),
         hp.ParameterTypeError, "factor must be a number, got [2.0, 3.0]", "llama"),
    Case("factor-numpy-array", lambda c: P(c.model, "yarn", factor=np.array([2.0])), hp.ParameterTypeError,
         "factor must be a number", "llama"),
    Case("factor-meta-tensor", lambda c: P(c.model, "yarn", factor=torch.tensor(2.0, device="meta")),
         hp.ParameterTypeError, "factor must be a number", "llama"),
    Case("target-huge", lambda c: P(c.model, "yarn", max_position_embeddings=10**12), hp.InvalidParameterError,
         "max_position_embeddings must be <= 2147483647", "llama"),
    Case("target-negative", lambda c: P(c.model, "yarn", max_position_embeddings=-64), hp.InvalidParameterError,
         "max_position_embeddings must be > 0", "llama"),
    Case("target-shorter", lambda c: P(c.model, "yarn", max_position_embeddings=63), hp.InvalidParameterError,
         "shorter than the model's original context 64", "llama"),
    Case("target-float", lambda c: P(c.model, "yarn", max_position_embeddings=64.0), hp.ParameterTypeError,
         "must be an int", "llama"),
    Case("target-bool", lambda c: P(c.model, "yarn", max_position_embeddings=True), hp.ParameterTypeError,
         "must be an int", "llama"),
    Case("no-target", lambda c: P(c.model, "yarn"), hp.InvalidParameterError, "needs max_position_embeddings=",
         "llama"),
    Case("relative-k-huge", lambda c: P(c.model, "relative_bias", k=10**10), hp.InvalidParameterError,
         "k must be <= 2147483647", "gpt2"),
    Case("longrope-dict", lambda c: P(c.model, "longrope", factor=2, long_factor={1: 2}), hp.ParameterTypeError,
         "long_factor must be a list of numbers", "llama"),
    Case("longrope-2d-tensor", lambda c: P(c.model, "longrope", factor=2, long_factor=torch.ones(2, 4)),
         hp.ParameterTypeError, "long_factor[0] must be a number", "llama"),
    Case("longrope-wrong-length", lambda c: P(c.model, "longrope", factor=2, long_factor=np.ones(3)),
         hp.InvalidParameterError, "long_factor has 3 values", "llama"),
    Case("layer-types-int", lambda c: P(c.model, "yarn", factor=2, layer_types=5), hp.ParameterTypeError,
         "layer_types must be a non-empty list of str", "llama"),
    Case("from-dict-none", lambda c: hp.configs.YarnConfig.from_dict(None), hp.ParameterTypeError,
         "must be a dict, got None"),
    # methods
    Case("method-none", lambda c: P(c.model, None, factor=2), hp.UnknownMethodError, "method must be a name",
         "llama"),
    Case("method-empty", lambda c: P(c.model, "", factor=2), hp.UnknownMethodError, "unknown method ''", "llama"),
    Case("method-upper-case", lambda c: P(c.model, "YARN", factor=2), hp.UnknownMethodError, "unknown method 'YARN'; known: ",
         "llama"),
    Case("method-a-class", lambda c: P(c.model, hp.configs.YarnConfig, factor=2), hp.UnknownMethodError,
         "method must be a name or a method config", "llama"),
    Case("unknown-parameter", lambda c: P(c.model, "yarn", factor=2, bogus=1), hp.InvalidParameterError,
         "unknown parameter(s) ['bogus']", "llama"),
    Case("config-and-keywords", lambda c: P(c.model, hp.configs.YarnConfig(factor=2), factor=3),
         hp.ParameterTypeError, "not both", "llama"),
    Case("rope-method-on-a-table", lambda c: P(c.model, "yarn", factor=2), hp.MethodNotApplicableError,
         "learned positions", "gpt2"),
    Case("already-patched", lambda c: P(c.model, "linear", factor=2), hp.AlreadyPatchedError,
         "already patched (method 'yarn')", "llama_yarn"),
    Case("unpatch-unpatched", lambda c: hp.unpatch(c.model), hp.NotPatchedError, "carries no hf_posenc patch",
         "llama"),
    # a learned table swapped for rotary positions with no rotary channel
    Case("rope-zero-rotary-channels", lambda c: P(c.model, "rope", partial_rotary_factor=0.01),
         hp.InvalidParameterError, "= 0 rotary channels per head of 16", "gpt2"),
    Case("rope-one-rotary-channel", lambda c: P(c.model, "rope", partial_rotary_factor=0.1),
         hp.InvalidParameterError, "the smallest partial_rotary_factor is 2/16 = 0.125", "bert"),
    # XPos scales past the float range: inf and NaN scores, silently
    Case("xpos-scale-base-tiny", lambda c: P(c.model, "xpos", scale_base=1e-300), hp.InvalidParameterError,
         "Use scale_base >= 0.6681", "llama"),
    Case("xpos-context-past-float-range", lambda c: P(c.model, "xpos", max_position_embeddings=131072),
         hp.InvalidParameterError, "scales q and k by up to e^160 at 131072 tokens", "llama"),
    # check_length
    Case("check-length-negative", lambda c: hp.check_length(c.model, -1), hp.InvalidParameterError,
         "length must be >= 0", "gpt2"),
    Case("check-length-str", lambda c: hp.check_length(c.model, "a"), hp.ParameterTypeError, "length must be an int",
         "gpt2"),
    Case("check-length-none", lambda c: hp.check_length(c.model, None), hp.InvalidParameterError,
         "length is required", "gpt2"),
    Case("check-length-too-long", lambda c: hp.check_length(c.model, 33), hp.SequenceTooLongError,
         "holds 32 positions", "gpt2"),
    # a checkpoint saved before the removed table was kept: it loads, and unpatch says why it cannot
    Case("unpatch-old-checkpoint-without-original-table", lambda c: hp.unpatch(c.loaded), hp.NotPatchedError,
         "unpatching this model would leave a random table", setup=without_original_table),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(case, tmp_path):
    refused_clearly_and_unchanged(case, tmp_path)


# -- the bounds of a method's parameters, in one line ------------------------------------------------------------------

API_CASES = [
    ("longrope-huge-long-factor", lambda: hp.patch(tiny_model(), "longrope", factor=2, long_factor=[1e300] * 8),
     hp.InvalidParameterError, r"long_factor\[0\] must be <= 2147483647, got 1e\+300"),
    ("longrope-huge-short-factor", lambda: hp.patch(tiny_model(), "longrope", factor=2, long_factor=[2.0] * 8,
                                                    short_factor=[1.0] * 7 + [float(2**40)]),
     hp.InvalidParameterError, r"short_factor\[7\] must be <= 2147483647"),
    ("longrope-factor-past-the-context", lambda: hp.patch(tiny_model(), "longrope", factor=2,
                                                          long_factor=[1.0] * 7 + [1e8]),
     hp.InvalidParameterError, r"long_factor\[7\]=100000000.0 stretches that pair to 6.4e\+09 positions .* "
                               r"each factor <= 3.35544e\+07"),
    ("dynamic-yarn-attention-factor", lambda: hp.patch(tiny_model(), "dynamic_yarn", factor=2, attention_factor=1.2),
     hp.InvalidParameterError, r"unknown parameter\(s\) \['attention_factor'\] for method 'dynamic_yarn'"),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_public_functions_refuse_bad_arguments(call, error, pattern):
    refused_as(call, error, pattern)


# -- unpatch after hp.from_pretrained ------------------------------------------------------------------------------

def stock_reference(model, path: Path):
    """The model as stock transformers saves and loads it (what unpatch must give back, config included)."""
    model.save_pretrained(path)
    return type(model).from_pretrained(path).eval()


def comparable(config) -> dict:
    """The config as it decides the model: its path aside, and the keys transformers 4.x reads, which a load
    writes from rope_parameters (hf_posenc._compat.write_legacy_rope_keys) and a config built in memory lacks."""
    out = config.to_dict()
    out.pop("_name_or_path", None)
    legacy = _compat.legacy_rope_keys(config) or {}
    for key in _compat.LEGACY_ROPE_KEYS:
        if key in legacy and out.get(key) == legacy[key]:
            out.pop(key, None)
    return out


@pytest.mark.parametrize("kind, method, params", [
    ("gpt2", "alibi", {}), ("gpt2", "rope", {}), ("gpt2", "relative_bias", {"k": 8}),
    ("bert", "alibi", {}), ("bert", "rope", {"partial_rotary_factor": 0.5}), ("bert", "relative_bias", {"k": 4}),
    ("roberta", "alibi", {}), ("opt", "rope", {}),
    ("llama", "alibi", {}), ("llama", "xpos", {}), ("llama", "relative_bias", {"k": 8}), ("llama", "yarn", {"factor": 2}),
    ("llama", "dynamic_yarn", {"factor": 2}), ("llama", "longrope", {"factor": 2, "long_factor": [2.0] * 8}),
])
def test_unpatch_after_from_pretrained_gives_the_original_model_bit_for_bit(tmp_path, kind, method, params):
    model = build(kind)
    reference = stock_reference(model, tmp_path / "original")
    hp.patch(model, method, **params)
    model.save_pretrained(tmp_path / "patched")
    loaded = hp.from_pretrained(tmp_path / "patched")
    hp.unpatch(loaded)
    assert hp.describe(loaded)["method"] is None and not is_patched(loaded)
    assert comparable(loaded.config) == comparable(reference.config)
    expected, got = reference.state_dict(), loaded.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    # its next save is the original model, which stock transformers loads with the original's logits
    again = stock_reference(loaded, tmp_path / "again")
    ids = token_ids(16, vocab=97) + 3
    assert torch.equal(logits(again, ids), logits(reference, ids))


def test_unpatch_peels_a_stacked_checkpoint_back_to_the_learned_table(tmp_path):
    model = tiny("gpt2")
    original = model.transformer.wpe.weight.detach().clone()
    loaded = hp.from_pretrained(stacked(tmp_path))
    hp.unpatch(loaded)
    assert hp.describe(loaded)["method"] == "rope"
    hp.unpatch(loaded)
    assert isinstance(loaded.transformer.wpe, nn.Embedding) and torch.equal(loaded.transformer.wpe.weight, original)


def test_a_checkpoint_saved_without_the_original_table_still_loads_patched(tmp_path):
    folder = without_original_table(tmp_path)
    model = tiny("gpt2")
    hp.patch(model, "alibi")
    loaded = hp.from_pretrained(folder)
    ids = token_ids(40, vocab=97) + 3
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    with pytest.raises(hp.NotPatchedError, match="load the original checkpoint"):
        hp.unpatch(loaded)
    assert hp.describe(loaded)["method"] == "alibi"


def test_stock_transformers_still_refuses_an_attention_patched_table(tmp_path):
    """The original table travels beside the empty one, which still stops stock loading."""
    folder = saved(tmp_path, "gpt2", "relative_bias", k=4)
    assert load_file(folder / "model.safetensors")[f"transformer.wpe.{ORIGINAL_TABLE}"].shape == (32, 32)
    with pytest.raises((RuntimeError, ValueError)):
        AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("method,params", [("interpolate", {}), ("sinusoidal", {"init": "fit"}), ("tile", {})])
def test_unpatch_after_reload_gives_the_stock_load_of_the_saved_table_and_says_so(tmp_path, method, params):
    """The folder holds the table the patch made, not the original: unpatch gives what stock transformers
    loads from it (documented in docs/patching.md and docs/learned_tables.md), with a warning saying so."""
    original = gpt2()
    ids = token_ids(N, vocab=100)
    before = logits(original, ids)
    hp.patch(original, method, factor=2, **params)
    original.save_pretrained(tmp_path)
    stock = AutoModelForCausalLM.from_pretrained(tmp_path).eval()

    restored = hp.from_pretrained(tmp_path).eval()
    with pytest.warns(UserWarning, match=r"holds only the position table\(s\) the .* not the model before the patch"):
        hp.unpatch(restored)
    assert torch.equal(logits(restored, ids), logits(stock, ids))
    assert type(restored.transformer.wpe) is torch.nn.Embedding and restored.config.n_positions == 2 * N
    assert not hasattr(restored.config, "hf_posenc")
    if method != "tile":  # tile's first N rows are the old ones: only it gives the old logits inside N
        assert not torch.equal(logits(restored, ids), before)

    with warnings.catch_warnings():  # a patch made in this process: bit for bit, silently
        warnings.simplefilter("error")
        hp.unpatch(original)
    assert torch.equal(logits(original, ids), before)


@pytest.mark.parametrize("make,method", [(lambda: tiny_model("llama"), "yarn"), (gpt2, "alibi")])
def test_unpatch_after_reload_is_bit_for_bit_where_the_folder_holds_the_original(tmp_path, make, method):
    model = make()
    ids = token_ids(N, vocab=100)
    before = logits(model, ids)
    hp.patch(model, method, factor=2)
    model.save_pretrained(tmp_path)
    restored = hp.from_pretrained(tmp_path).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        hp.unpatch(restored)
    assert torch.equal(logits(restored, ids), before)



# -- numpy and torch values are saved as plain JSON ----------------------------------------------------------------

@pytest.mark.parametrize("method, params", [
    ("yarn", {"factor": torch.tensor(2.0)}),
    ("yarn", {"factor": np.float64(2.0), "beta_fast": np.int64(16), "truncate": np.bool_(False)}),
    ("linear", {"max_position_embeddings": np.int64(128)}),
    ("longrope", {"factor": 2, "long_factor": torch.full((8,), 2.0)}),
    ("longrope", {"factor": 2, "long_factor": np.full(8, 2.0), "short_factor": torch.ones(8, requires_grad=True)}),
    ("longrope", {"factor": 2, "long_factor": [np.float32(2.0)] * 8}),
    ("longrope", {"factor": 2, "long_factor": [torch.tensor(2.0)] * 8}),
])
def test_numpy_and_torch_parameters_save_and_reload(tmp_path, method, params):
    model = tiny_model()
    hp.patch(model, method, **params)
    record = model.config.hf_posenc["params"]
    assert all(type(v) in (int, float, bool, str, type(None), list, tuple) for v in record.values())
    model.save_pretrained(tmp_path)
    saved_record = json.loads((tmp_path / "config.json").read_text())["hf_posenc"]["params"]
    assert saved_record == json.loads(json.dumps(record))
    ids = token_ids(150)
    expected = logits(model, ids)
    assert torch.equal(logits(hp.from_pretrained(tmp_path), ids), expected)
    assert torch.equal(logits(AutoModelForCausalLM.from_pretrained(tmp_path).eval(), ids), expected)  # stock


def test_a_patch_whose_record_is_not_json_is_refused_before_anything_changes(tmp_path, monkeypatch):
    """A half-written config.json came from save_pretrained opening the file, then failing to serialise a tensor
    in the record. Parameters are plain now; the record is also checked when patching."""
    model = tiny_model()
    before = model_state(model)
    monkeypatch.setattr(hp.configs.YarnConfig, "to_dict", lambda self: {"factor": {2.0}})
    with pytest.raises(hp.ParameterTypeError, match="cannot be saved in config.json"):
        hp.patch(model, "yarn", factor=2)
    assert_same_model(before, model_state(model))
    assert not is_patched(model)


# -- PEFT, training ------------------------------------------------------------------------------------------------

def test_patch_describe_unpatch_work_through_a_peft_wrapper():
    peft = pytest.importorskip("peft")
    reference = tiny("gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: fan_in_fan_out for GPT-2's Conv1D
        wrapped = peft.get_peft_model(tiny("gpt2"), peft.LoraConfig(r=2, target_modules=["c_attn"]))
    base = wrapped.get_base_model()
    assert hp.describe(wrapped)["mechanism"] == "learned"
    ids = token_ids(48, vocab=97) + 3  # past the 32-position table
    assert hp.patch(wrapped, "interpolate", factor=2) is wrapped
    assert hp.describe(wrapped)["method"] == "interpolate" and is_patched(base)
    with torch.no_grad():
        assert wrapped(ids).logits.shape == (1, 48, 100)
    expected = hp.patch(tiny("gpt2"), "interpolate", factor=2)
    with torch.no_grad():  # LoRA starts at zero: the wrapper is the patched model
        assert torch.allclose(wrapped(ids).logits, expected(ids).logits, atol=1e-6)
    hp.unpatch(wrapped)
    short = ids[:, :32]
    with torch.no_grad():
        assert torch.allclose(wrapped(short).logits, reference(short).logits, atol=1e-6)
    assert any("lora_" in name for name, _ in wrapped.named_parameters())


@pytest.mark.parametrize("method, params", [("interpolate", {"factor": 2}), ("tile", {"factor": 2}),
                                            ("sinusoidal", {"factor": 2, "trainable": True}),
                                            ("relative_bias", {"k": 4})])
def test_a_patch_in_the_middle_of_training_warns_about_the_optimizer(method, params):
    model = tiny("gpt2").train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(token_ids(8, vocab=97) + 3, labels=token_ids(8, vocab=97) + 3).loss.backward()
    optimizer.step()
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    with pytest.warns(UserWarning, match="not in any optimizer built before this call"):
        hp.patch(model, method, **params)
    new = [p for p in model.parameters() if id(p) not in held]
    assert new and all(p.requires_grad for p in new)  # what the warning is about: the optimizer lacks them


@pytest.mark.parametrize("kind, method, params, mode", [
    ("gpt2", "interpolate", {"factor": 2}, "eval"),  # loaded models are in eval mode: patch, then build the optimizer
    ("gpt2", "sinusoidal", {"factor": 2}, "train"),  # no new trainable parameter
    ("llama", "yarn", {"factor": 2}, "train"),
])
def test_no_warning_where_no_optimizer_can_miss_a_parameter(kind, method, params, mode):
    model = build(kind)
    getattr(model, mode)()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hp.patch(model, method, **params)
