"""The chunked training loss: the same loss and gradients as the full logits, block by block, on the
families whose forward scales its logits; a model it cannot rebuild is detected."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_posenc as hp
from hf_posenc import causal_lm
from hf_posenc.train import losses
from tiny import tiny_config, tiny_model, token_ids
from transformers import AutoModelForCausalLM

FAMILIES = {
    "llama": {},
    "gemma2": {"final_logit_softcapping": 3.0, "layer_types": ["full_attention", "sliding_attention"],
               "sliding_window": 16},
    "cohere": {"logit_scale": 0.3},
    "granite": {"logits_scaling": 4.0},
}


def build(family):
    if family == "gemma2":  # soft-capped attention scores: eager only
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(tiny_config(family, **FAMILIES[family]), attn_implementation="eager")
    return tiny_model(family, **FAMILIES[family])


def batch(length=40, pad=9):
    ids = token_ids(length, batch=2, vocab=120, seed=3) + 2
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0  # left padding on the second row
    return ids, mask


def gradients(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_lm_loss_equals_the_full_one(family, chunk):
    model = hp.patch(build(family), "yarn", factor=2).train()
    for module in model.modules():  # dropout off: the two passes must see the same network
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    ids, mask = batch()
    assert causal_lm.output_logits_mismatch(model) is None
    full = losses.lm_loss(model, ids, mask)
    grads_full = gradients(model, full)
    chunked = losses.chunked_lm_loss(model, ids, mask, chunk)
    grads_chunked = gradients(model, chunked)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-6)
    assert grads_chunked.keys() == grads_full.keys()
    for name in grads_full:
        torch.testing.assert_close(grads_chunked[name], grads_full[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_chunked_distill_loss_equals_the_full_one(temperature):
    teacher = tiny_model().eval().requires_grad_(False)
    student = hp.patch(copy.deepcopy(teacher).requires_grad_(True), "linear", factor=2).train()
    torch.manual_seed(1)
    with torch.no_grad():  # a student that has drifted from its teacher, as training makes it
        for param in student.parameters():
            param.add_(0.05 * torch.randn_like(param))
    ids, mask = batch()
    full = losses.distill_loss(student, teacher, ids, mask, causal=True, temperature=temperature)
    grads_full = gradients(student, full)
    chunked = losses.chunked_distill_loss(student, teacher, ids, mask, 6, temperature)
    grads_chunked = gradients(student, chunked)
    assert full.item() > 1e-3  # there is something to match
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-7)
    for name in grads_full:
        torch.testing.assert_close(grads_chunked[name], grads_full[name], rtol=1e-4, atol=1e-7, msg=name)


def test_training_loss_module_routes_each_objective():
    model = tiny_model().train()
    ids, mask = batch()
    for chunk in (0, 5):
        wrapped = losses.TrainingLoss(model, objective="lm", causal=True, chunk=chunk)
        torch.testing.assert_close(wrapped(ids, mask), losses.lm_loss(model, ids, mask), rtol=1e-5, atol=1e-6)
    encoder = losses.TrainingLoss(model, objective="distill", causal=False, chunk=5)
    assert encoder.chunk == 0  # encoders match hidden states: no logits to chunk


def test_a_forward_that_does_more_to_its_logits_is_detected():
    model = tiny_model()
    forward = model.forward

    def doubled(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits * 2
        return out

    model.forward = doubled
    assert "differ" in causal_lm.output_logits_mismatch(model)


def test_lora_model_chunked_equals_full():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_model(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    ids, mask = batch()
    assert causal_lm.output_logits_mismatch(model) is None
    torch.testing.assert_close(losses.chunked_lm_loss(model, ids, mask, 8), losses.lm_loss(model, ids, mask),
                               rtol=1e-5, atol=1e-6)
