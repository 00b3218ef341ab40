"""A fine-tune's distill teacher (hf_posenc/train/teacher.py): the same weights with
Self-Extend, matched at the training window's ids (a PoSE window's spread ids): the loss against a KL written
out, a run that resumes bit-exact, and the configs it cannot run refused before anything loads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_posenc as hp
from hf_posenc.train import checkpoints as ckpt
from hf_posenc.errors import ConfigError
from hf_posenc.train.losses import TrainingLoss
from test_finetune import run_recipe, state, text_file, tiny_dir, write_config  # noqa: F401 (fixtures)
from test_finetune_long import gpt2_dir, straight_and_resumed  # noqa: F401 (fixtures)
from tiny import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

TEACHER = {"objective": "distill", "teacher": "self_extend", "positions": "pose chunks=2"}


def pose_window(n: int = 40) -> torch.Tensor:
    return torch.cat([torch.arange(n // 2), torch.arange(n // 2, n) + 150])[None]


@pytest.mark.parametrize("chunk", [0, 7])
def test_the_loss_is_the_kl_to_self_extend_at_the_windows_ids(chunk):
    student = hp.patch(tiny_model(seed=1), "yarn", max_position_embeddings=256)
    teacher = hp.patch(tiny_model(seed=1).eval(), "self_extend", max_position_embeddings=256)
    ids = torch.randint(3, 100, (1, 40), generator=torch.Generator().manual_seed(0))
    mask, at = torch.ones_like(ids), pose_window()
    objective = TrainingLoss(student, objective="distill", causal=True, chunk=chunk, teacher_reads_ids=True)
    loss = objective(ids, mask, teacher=teacher, position_ids=at)
    with torch.no_grad():
        p = F.log_softmax(teacher(ids, position_ids=at).logits[0].float(), -1)
        q = F.log_softmax(student(ids, position_ids=at).logits[0].float(), -1)
        at_token_order = F.log_softmax(teacher(ids).logits[0].float(), -1)
    torch.testing.assert_close(loss.detach(), F.kl_div(q, p, log_target=True, reduction="batchmean"), atol=1e-5,
                               rtol=1e-4)
    assert (at_token_order - p).abs().max() > 1e-3   # the teacher read the spread ids
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())


def test_without_teacher_reads_ids_position_ids_are_refused():
    student = tiny_model()
    objective = TrainingLoss(student, objective="distill", causal=True)
    ids = torch.randint(3, 100, (1, 40))
    with pytest.raises(ValueError, match="teacher_reads_ids"):
        objective(ids, torch.ones_like(ids), teacher=tiny_model(), position_ids=pose_window())
    with pytest.raises(hp.InvalidParameterError, match="distill objective only"):
        TrainingLoss(student, objective="lm", causal=True, teacher_reads_ids=True)


def test_a_self_extend_teacher_run_resumes_bit_exact_and_says_so(tmp_path, tiny_dir, text_file, capsys):  # noqa: F811
    straight, _, out = straight_and_resumed(tmp_path, tiny_dir, text_file, train=TEACHER)
    assert "objective distill from the self_extend teacher" in capsys.readouterr().out
    assert straight.config.rope_parameters["rope_type"] == "yarn"   # the student's patch, not the teacher's
    assert "self_extend" not in (out / "config.json").read_text()
    card = (out / "README.md").read_text()
    assert "distill" in card and "self_extend" in card
    # the teacher's own parameters reach the loss: another window, another first step
    other = run_recipe(write_config(tmp_path / "w" / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                                    train={**TEACHER, "teacher": "self_extend window=16", "steps": 1,
                                           "warmup_steps": 1}))
    assert other is not None
    assert ckpt.read_log(tmp_path / "w" / "out")[0]["loss"] != ckpt.read_log(out)[0]["loss"]


BAD = [
    ({"train": {"teacher": "self_extend"}}, "is the model train.objective=distill matches"),
    ({"train": {**TEACHER, "teacher": "dca"}}, "unknown teacher 'dca'; known: unpatched, self_extend"),
    ({"train": {**TEACHER, "teacher": "unpatched group_size=2"}}, "the unpatched teacher takes no parameters"),
    ({"train": {**TEACHER, "teacher": "self_extend max_position_embeddings=512"}},
     "the teacher's context is the patched one"),
    ({"train": {**TEACHER, "teacher": "self_extend group_size=0"}}, "group_size must be >= 1"),
    ({"train": {**TEACHER, "teacher": "self_extend group_size=2"}},
     "cannot be this model patched to 256 positions"),   # G 2 reaches 224 of 256
    ({"train": {**TEACHER, "teacher": "unpatched"}}, "or distill from a teacher that reads spread ids"),
    ({"train": TEACHER, "model": "GPT2", "posenc": None}, "train.teacher='self_extend' cannot be this model"),
]


@pytest.mark.parametrize("sections, message", BAD, ids=[b[1][:30] for b in BAD])
def test_teachers_that_cannot_run_are_refused_with_nothing_written(tmp_path, tiny_dir, gpt2_dir, text_file,  # noqa: F811
                                                                    sections, message):
    sections = {"data": {"corpus": str(text_file)}, **sections}
    if sections.get("model") == "GPT2":
        sections["model"] = {"name": str(gpt2_dir), "dtype": "float32"}
    cfg = write_config(tmp_path / "cfg" / "c.yaml", tiny_dir, **sections)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as refused:
        run_recipe(cfg)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
