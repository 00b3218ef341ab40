"""The chunked training loss: the same loss and gradients as the full logits, block by block, on the
families whose forward scales its logits; a model it cannot rebuild is detected. Wrong-type, empty and
out-of-range input to the losses (hf_posenc/train/losses.py, hf_posenc/causal_lm.py) is refused in one line."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_posenc as hp
from hf_posenc import causal_lm
from hf_posenc.train import losses
from refusals import IDS, MASK, CallCase, encoder, llama, refused_in_one_line, table
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


# -- wrong-type, empty and out-of-range input to the losses: one line naming the argument -------------------------

CALL_CASES = [
    # hf_posenc.train.losses
    CallCase("longce_weights-clip-0", lambda: losses.longce_weights(torch.zeros(3), torch.zeros(3), clip=0),
             hp.InvalidParameterError, "clip must be a number >= 1 (the largest weight), got 0"),
    CallCase("longce_weights-floor-2", lambda: losses.longce_weights(torch.zeros(3), torch.zeros(3), clip=5, floor=2),
             hp.InvalidParameterError, "floor must be a number in [0, 1] (the smallest weight), got 2"),
    CallCase("longce_weights-clip-a-str", lambda: losses.longce_weights(torch.zeros(3), torch.zeros(3), clip="a"),
             hp.InvalidParameterError, "clip must be a number >= 1 (the largest weight), got 'a'"),
    CallCase("longce_weights-shapes-differ", lambda: losses.longce_weights(torch.zeros(3), torch.zeros(4), clip=5),
             hp.InvalidInputError, "long and short must be loss tensors of one shape"),
    CallCase("LongCE-window-0", lambda: losses.LongCE(0, 1), hp.InvalidParameterError,
             "window must be an int >= 1, got 0"),
    CallCase("longce_loss-encoder", lambda: losses.longce_loss(encoder(), IDS, MASK, losses.LongCE(4, 2)),
             hp.UnsupportedModelError, "longce_loss: model is a BertForMaskedLM (bert), not a causal LM"),
    CallCase("longce_loss-learned-table", lambda: losses.longce_loss(table(), IDS, MASK, losses.LongCE(4, 2)),
             hp.UnsupportedModelError, "this model's positions are 'learned': patch it to rope first"),
    CallCase("longce_loss-no-longce", lambda: losses.longce_loss(llama(), IDS, MASK, None), hp.ParameterTypeError,
             "longce must be a LongCE(window, stride, ...), got None"),
    CallCase("longce_loss-past-the-vocabulary",
             lambda: losses.longce_loss(llama(), torch.full((1, 16), 9999), MASK, losses.LongCE(4, 2)),
             hp.InvalidInputError, "input_ids hold token ids 9999..9999; this model's vocabulary is 0..259"),
    CallCase("longce_loss-chunk-negative", lambda: losses.longce_loss(llama(), IDS, MASK, losses.LongCE(4, 2), chunk=-1),
             hp.InvalidParameterError, "chunk must be >= 0, got -1"),
    CallCase("longce_loss-mask-of-another-shape",
             lambda: losses.longce_loss(llama(), IDS, MASK[:, :8], losses.LongCE(4, 2)),
             hp.InvalidInputError, "attention_mask must be an int tensor of input_ids' shape (1, 16), got (1, 8)"),
    CallCase("lm_loss-encoder", lambda: losses.lm_loss(encoder(), IDS, MASK), hp.UnsupportedModelError,
             "lm_loss: model is a BertForMaskedLM (bert), not a causal LM"),
    CallCase("chunked_lm_loss-chunk-0", lambda: losses.chunked_lm_loss(llama(), IDS, MASK, 0), hp.InvalidParameterError,
             "chunk must be >= 1, got 0"),
    CallCase("TrainingLoss-unknown-objective", lambda: losses.TrainingLoss(llama(), objective="x", causal=True),
             hp.InvalidParameterError, "objective must be 'lm' or 'distill', got 'x'"),
    CallCase("short_context_losses-window-0", lambda: losses.short_context_losses(llama(), IDS, MASK, 0, 0),
             hp.InvalidParameterError, "window must be an int >= 1, got 0"),
    CallCase("distill_loss-no-teacher", lambda: losses.distill_loss(llama(), None, IDS, MASK, causal=True),
             hp.InvalidInputError, "distill needs the teacher model (the unpatched model), got None"),
    # hf_posenc.causal_lm
    CallCase("output_logits_mismatch-no-model", lambda: causal_lm.output_logits_mismatch(None), hp.InvalidInputError,
             "output_logits_mismatch needs a transformers model, got None"),
    CallCase("next_token_losses-chunk-negative",
             lambda: causal_lm.next_token_losses(llama(), torch.zeros(1, 4, 64), torch.ones(1, 4, dtype=torch.long), -1),
             hp.InvalidParameterError, "chunk must be >= 0, got -1"),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[c.id for c in CALL_CASES])
def test_bad_input_to_the_python_api_is_refused_in_one_line(case):
    refused_in_one_line(case)
