"""The training-loss contract (`train.loss`: hf_posenc/train/losses.py's LOSSES; docs/ARCHITECTURE.md, "Training
losses"), run on every registered loss, the shipped ones and the worked example tests/examples/poly_loss.py
(registered for the tests only), with nothing to write: at its `plain` settings the loss and its gradients are the
cross-entropy's; each example changes the loss, gives the same loss and gradients a block of logits at a time as
whole, leaves padding out and takes the position ids; each refusal is one line naming the parameter, and the recipe
names the setting (`train.<loss>_<parameter>`); the recipe takes its name, builds it from its settings and trains
through it; a shipped loss is named by `train.loss`' help and docs/finetune.md's table, each of its parameters a
field of the config. One loss: `pytest -m contract -k my_loss tests/test_loss_contract.py`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from hf_posenc.train import checkpoints as ckpt
from hf_posenc.train import losses as L
from hf_posenc.errors import ConfigError, InvalidParameterError, PosEncError
from hf_posenc.recipes import finetune_config as FC
from test_finetune import run_recipe, text_file, tiny_dir, write_config  # noqa: F401
from tiny import tiny_model, token_ids

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parent.parent
NAMES = list(L.LOSSES)
# the losses an installed hf_posenc has (the worked example is registered by the tests only)
SHIPPED = [name for name, cls in L.LOSSES.items() if cls.__module__.startswith("hf_posenc.")]
EXAMPLES = [(name, i) for name in NAMES for i in range(len(L.LOSSES[name].contract.examples))]
N = 24


def batch():
    """Two rows of N tokens, the second padded from token 19."""
    ids = token_ids(N, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 19:] = 0
    return ids, mask


def with_grads(model, compute):
    """The loss `compute()` gives and the gradient of every parameter."""
    model.zero_grad()
    value = compute()
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return value.detach(), grads


def assert_same(a, b, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(a[0], b[0], rtol=rtol, atol=atol)
    for n in a[1]:
        torch.testing.assert_close(a[1][n], b[1][n], rtol=10 * rtol, atol=atol, msg=n)


@pytest.fixture(scope="module")
def model():
    return tiny_model().train()


def test_the_worked_example_is_registered_for_the_tests_only():
    assert L.LOSSES["poly1"].__module__ == "examples.poly_loss" and "poly1" not in SHIPPED
    assert set(SHIPPED) >= {"ce", "longce"}


# ----------------------------------------------------------------------------- the loss contract: every loss
@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_a_loss_says_what_it_is(name):
    cls = L.LOSSES[name]
    assert cls.name == name and cls.summary and cls.__doc__, f"{name}: name, summary and a docstring"
    assert isinstance(cls.contract, L.LossContract) and cls.contract.examples, f"{name}: a contract with examples"
    for params in cls.contract.examples:
        line = cls(**params).describe()
        assert line and "\n" not in line


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("chunk", [0, 5])
def test_at_its_plain_settings_it_is_the_cross_entropy(model, name, chunk):
    plain = L.LOSSES[name].contract.plain
    if plain is None:
        pytest.skip(f"{name} declares no settings at which it is the cross-entropy")
    ids, mask = batch()
    ours = with_grads(model, lambda: L.LOSSES[name](**plain).lm_loss(model, ids, mask, chunk=chunk))
    assert_same(ours, with_grads(model, lambda: L.lm_loss(model, ids, mask)))


@pytest.mark.contract
@pytest.mark.parametrize("name, example", EXAMPLES)
def test_each_example_changes_the_loss_the_same_a_block_at_a_time(model, name, example):
    cls = L.LOSSES[name]
    params = cls.contract.examples[example]
    loss = cls(**params)
    ids, mask = batch()
    whole = with_grads(model, lambda: loss.lm_loss(model, ids, mask, chunk=0))
    assert torch.isfinite(whole[0]) and any(bool(g.abs().sum() > 0) for g in whole[1].values())
    assert_same(with_grads(model, lambda: loss.lm_loss(model, ids, mask, chunk=5)), whole)
    if params != cls.contract.plain:
        plain = L.lm_loss(model, ids, mask).detach()
        assert not torch.allclose(whole[0], plain, rtol=1e-6, atol=0), f"{name} {params} is the cross-entropy"
    # the padded tokens neither count nor weigh, whatever they are
    noisy = ids.masked_fill(mask == 0, 7)
    torch.testing.assert_close(loss.lm_loss(model, noisy, mask).detach(), whole[0], rtol=1e-6, atol=1e-7)
    # the position ids reach the model: 0..n-1 given is the default, shifted ones are another loss
    positions = torch.arange(N).expand(2, N)
    torch.testing.assert_close(loss.lm_loss(model, ids, mask, position_ids=positions).detach(), whole[0],
                               rtol=1e-6, atol=1e-7)
    assert not torch.equal(loss.lm_loss(model, ids, mask, position_ids=positions * 2).detach(), whole[0])


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_bad_settings_are_refused_in_one_line_naming_the_parameter_and_the_setting(model, name):
    cls = L.LOSSES[name]
    run = L.LossRun(model, "lm", "full", original=64, seq_len=48)
    for refused in cls.contract.refused:
        with pytest.raises(PosEncError) as caught:
            cls(**refused.params)
        assert refused.error in str(caught.value) and "\n" not in str(caught.value)
        with pytest.raises(ConfigError) as caught:
            cls.for_run(refused.params, run)
        assert f"train.{name}_{refused.error}" in str(caught.value), (
            f"the refusal of {refused.params} must begin with the parameter's name: {caught.value}")


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_the_recipe_takes_its_name_and_builds_it_from_its_settings(model, name):
    cls = L.LOSSES[name]
    assert FC.TrainArgs(loss=name).loss == name   # the config's check reads the registry
    params = cls.contract.examples[0]
    built = cls.for_run(params, L.LossRun(model, "lm", "full", original=64, seq_len=48))
    assert built == cls(**params)
    ids, mask = batch()
    step = L.TrainingLoss(model, objective="lm", causal=True, chunk=5, loss=built)
    assert torch.equal(step(ids, mask), built.lm_loss(model, ids, mask, chunk=5))


def test_the_recipe_trains_with_a_loss_it_never_names(tmp_path, tiny_dir, text_file):  # noqa: F811
    """The worked example, registered by the tests only: train.loss=poly1 runs, its setting not in the config
    (the default epsilon), and the card says what it trained with."""
    config = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                          train={"loss": "poly1", "steps": 1, "warmup_steps": 1, "save_every": 1})
    assert run_recipe(config) is not None
    out = tmp_path / "out"
    assert ckpt.read_log(out)[0]["loss"] > 0
    assert "Poly-1 (Leng et al. 2022): each token's cross-entropy + epsilon (1 - p) (epsilon=1.0)" in \
        (out / "README.md").read_text()


@pytest.mark.contract
@pytest.mark.parametrize("name", SHIPPED)
def test_the_help_the_docs_and_the_config_name_every_shipped_loss(name):
    help_text = FC.TrainArgs.__dataclass_fields__["loss"].metadata["help"]
    assert re.search(rf"\b{name}\b", help_text), f"train.loss' help (recipes/finetune_config.py) omits {name}"
    assert name in docs_rows(), f"docs/finetune.md's table of train.loss has no row for {name}"
    fields = FC.TrainArgs.__dataclass_fields__
    for f in dataclasses.fields(L.LOSSES[name]):
        setting = fields.get(f"{name}_{f.name}")
        assert setting is not None and setting.metadata.get("help"), (
            f"loss {name}'s parameter {f.name} has no field train.{name}_{f.name} with a help line "
            f"(recipes/finetune_config.py)")


def docs_rows() -> list[str]:
    text = (ROOT / "docs/finetune.md").read_text()
    table = text[text.index("| `train.loss` |"):]
    return re.findall(r"^\| `(\w+)[^`]*`", table[:table.index("\n\n")], re.M)[1:]   # past the header


def test_the_docs_table_names_only_registered_losses():
    assert sorted(docs_rows()) == sorted(SHIPPED)


# ------------------------------------------------------------------------------------------ the registry
def test_register_loss_refuses_a_taken_name_naming_both_classes():
    @dataclasses.dataclass(frozen=True)
    class LongCE(L.TrainLoss):
        name = "longce"

    with pytest.raises(InvalidParameterError, match=r"'longce' is registered twice: hf_posenc.train.losses.LongCE and "
                                                    r"test_loss_contract.*LongCE"):
        L.register_loss(LongCE)
    with pytest.raises(InvalidParameterError, match="takes a @dataclass"):
        L.register_loss(dict)
    LongCE.name = "Not A Name"
    with pytest.raises(InvalidParameterError, match="needs its own name, a lowercase word"):
        L.register_loss(LongCE)
    assert L.LOSSES["longce"] is L.LongCE


def test_the_config_refuses_an_unknown_loss_naming_the_registered_ones():
    with pytest.raises(ConfigError, match=r"train.loss must be one of ce, longce.* got 'nosuch'"):
        FC.TrainArgs(loss="nosuch")


@pytest.mark.parametrize("token_losses, words", [
    (lambda self, losses: losses.mean(), "must return one loss a token, shape (2, "),
    (lambda self, losses: losses.sum(-1), "must return one loss a token"),
    (lambda self, losses: losses.detach(), "without their gradient"),
    (lambda self, losses: [0.0], "got list"),
])
@pytest.mark.parametrize("chunk", [0, 8])
def test_a_loss_that_breaks_its_contract_is_refused_naming_it(token_losses, words, chunk):
    """A scalar or a row's loss would be broadcast over every token, a detached one would train nothing: each
    refused naming the loss, not trained on."""
    broken = dataclasses.make_dataclass("Broken", [], bases=(L.TrainLoss,), frozen=True,
                                        namespace={"name": "broken", "token_losses": token_losses})
    ids, mask = batch()
    with pytest.raises(PosEncError, match=re.escape(words)) as refused:
        broken().lm_loss(tiny_model(), ids, mask, chunk=chunk)
    assert "training loss 'broken'" in str(refused.value)
