"""A patched model of each kind (a RoPE scaling, a learned-table swap, an attention method) trains with
transformers' Trainer, with peft LoRA and with TRL's SFTTrainer, keeps its patch, saves, and reloads
with the trained weights and the same logits."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from test_learned import tiny
from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer, token_ids
from transformers import Trainer, TrainingArguments

import hf_posenc as hp

# (model builder, method, params, context the training sequences reach), one per mechanism kind
KINDS = {
    "rope-yarn": (lambda: tiny_model(), "yarn", {"factor": 2}, 128),
    "learned-interpolate": (lambda: tiny("gpt2"), "interpolate", {"factor": 2}, 64),
    "attention-relative_bias": (lambda: tiny("gpt2"), "relative_bias", {"k": 8}, 48),
}


def sequences(model, length: int, n: int = 4) -> Dataset:
    vocab = model.config.get_text_config().vocab_size
    ids = token_ids(length, batch=n, vocab=vocab - 3, seed=1) + 3
    return Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})


def arguments(tmp_path, **overrides) -> TrainingArguments:
    settings = dict(output_dir=str(tmp_path / "trainer"), max_steps=12, per_device_train_batch_size=2,
                    learning_rate=3e-3, warmup_steps=0, logging_steps=1, save_strategy="no", report_to=[],
                    use_cpu=True, seed=0, disable_tqdm=True)
    return TrainingArguments(**{**settings, **overrides})


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def trained_names(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_trainer_trains_saves_and_reloads_a_patched_model(tmp_path, kind):
    build, method, params, length = KINDS[kind]
    model = hp.patch(build(), method, **params).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = sequences(model, length)
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=data)
    trainer.train()
    curve = losses(trainer)
    assert len(curve) == 12 and all(torch.isfinite(torch.tensor(curve)))
    assert sum(curve[-3:]) < sum(curve[:3])  # it learned the repeated batch
    assert hp.describe(model)["method"] == method  # the patch survived training
    positional = [n for n in trained_names(model) if "wpe" in n or "hf_posenc" in n]
    if kind != "rope-yarn":  # the swapped table / the new bias trained too
        assert positional and all(not torch.equal(before[n], dict(model.named_parameters())[n]) for n in positional)

    trainer.save_model(str(tmp_path / "saved"))
    reloaded = hp.from_pretrained(tmp_path / "saved").eval()
    assert hp.describe(reloaded)["method"] == method
    batch = torch.tensor(data["input_ids"][:2])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(batch).logits, model(batch).logits, rtol=0, atol=0)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_lora_on_a_patched_model_trains_merges_and_reloads(tmp_path, kind):
    peft = pytest.importorskip("peft")
    build, method, params, length = KINDS[kind]
    model = hp.patch(build(), method, **params)
    data = sequences(model, length)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    trainer = Trainer(model=wrapped, args=arguments(tmp_path, learning_rate=1e-2), train_dataset=data)
    trainer.train()
    assert sum(losses(trainer)[-3:]) < sum(losses(trainer)[:3])
    merged = wrapped.merge_and_unload().eval()
    assert hp.describe(merged)["method"] == method
    merged.save_pretrained(tmp_path / "merged")
    reloaded = hp.from_pretrained(tmp_path / "merged").eval()
    batch = torch.tensor(data["input_ids"][:2])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(batch).logits, merged(batch).logits, rtol=0, atol=0)


def test_trl_sft_trainer_on_a_patched_model(tmp_path):
    trl = pytest.importorskip("trl")
    tokenizer = tiny_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    model = hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=64), "yarn", factor=2)
    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    data = Dataset.from_dict({"text": [text * 1, text[::-1]] * 2})
    config = trl.SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=6, per_device_train_batch_size=2,
                           learning_rate=3e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                           max_length=128, packing=False, disable_tqdm=True)
    trainer = trl.SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    assert len(losses(trainer)) == 6 and losses(trainer)[-1] < losses(trainer)[0]
    trainer.save_model(str(tmp_path / "saved"))
    reloaded = hp.from_pretrained(tmp_path / "saved").eval()
    assert hp.describe(reloaded)["method"] == "yarn" and hp.describe(reloaded)["max_position_embeddings"] == 128
