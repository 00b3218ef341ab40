"""The fine-tune recipe's long-context training options on tiny models (hf_posenc/recipes/finetune_long.py):
train.attention=s2 with LoRA + trainable embeddings and norms, gradient checkpointing and the chunked loss;
train.loss=longce with a position scheme; each killed and resumed to the weights of a straight run, bit for
bit; the saved model with full attention and a card that says how it was trained; the configs that cannot
work refused in one line with nothing written, and the real script's exit code 2. The mechanisms themselves:
tests/test_s2_attention.py, tests/test_longce.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import hf_posenc as hp
from hf_posenc import _compat
from hf_posenc.train import checkpoints as ckpt
from hf_posenc.train import s2_attention
from hf_posenc.errors import ConfigError
from test_finetune import RECIPE, run_recipe, state, text_file, tiny_dir, write_config  # noqa: F401 (fixtures)
from tiny import TINY_TEXT_VOCAB, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

S2 = {"attention": "s2", "s2_group": 16, "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
      "trainable": ["embeddings", "norms"], "loss_chunk": 16}
LONGCE = {"loss": "longce", "longce_window": 16, "longce_stride": 8, "longce_clip": 3.0, "positions": "pose chunks=2",
          "loss_chunk": 16}


def straight_and_resumed(tmp_path, tiny_dir, text_file, model=None, **sections):  # noqa: F811
    """A straight run and one stopped after step 3 then resumed: (straight final model, resumed final model,
    the straight run's folder)."""
    sections = {"data": {"corpus": str(text_file)}, **sections}
    straight = run_recipe(write_config(tmp_path / "a" / "c.yaml", tiny_dir, **sections))
    cfg = write_config(tmp_path / "b" / "c.yaml", tiny_dir, **sections)
    assert run_recipe(cfg, "--train.stop_after_steps", "3") is None
    resumed = run_recipe(cfg, "--resume")
    for (name, a), b in zip(state(straight).items(), state(resumed).values()):
        assert torch.equal(a, b), name
    losses = lambda run: [r["loss"] for r in ckpt.read_log(tmp_path / run / "out")]  # noqa: E731
    assert len(losses("a")) == 6 and losses("a") == losses("b")
    return straight, resumed, tmp_path / "a" / "out"


def test_s2_with_lora_plus_resumes_bit_exact_and_saves_full_attention(tmp_path, tiny_dir, text_file):  # noqa: F811
    straight, _, out = straight_and_resumed(tmp_path, tiny_dir, text_file, train=S2,
                                            model={"name": str(tiny_dir), "dtype": "float32",
                                                   "gradient_checkpointing": True})
    assert _compat.attention_implementation(straight.config) == "sdpa" and not s2_attention.enabled(straight)
    assert s2_attention.NAME not in (out / "config.json").read_text()
    card = (out / "README.md").read_text()
    assert "S2-Attn (LongLoRA) in training: attention inside groups of 16 tokens, half the heads on the groups " \
           "shifted by 8; the saved model uses full attention" in card
    # the groups did train: the first step's loss is not full attention's (the same weights, data and seed)
    full = run_recipe(write_config(tmp_path / "full" / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                                   train={**S2, "attention": "full", "steps": 1, "warmup_steps": 1},
                                   model={"name": str(tiny_dir), "dtype": "float32", "gradient_checkpointing": True}))
    assert full is not None
    first = lambda run: ckpt.read_log(run)[0]["loss"]  # noqa: E731
    assert first(tmp_path / "full" / "out") != first(out)
    # LoRA, embeddings and norms trained; the rest as it was
    base = state(hp.from_pretrained(str(tiny_dir)))
    trained = state(straight)
    assert not torch.equal(trained["model.norm.weight"], base["model.norm.weight"])
    assert not torch.equal(trained["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert not torch.equal(trained["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])   # LoRA merged into it
    assert torch.equal(trained["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"])


def test_checkpointing_with_lora_warns_of_no_deprecated_transformers_name(tmp_path, tiny_dir, text_file,  # noqa: F811
                                                                          recwarn):
    """transformers 5.23+ renamed gradient checkpointing to activation checkpointing; a run with both it and
    LoRA (peft reads the old name) prints no FutureWarning about it."""
    assert run_recipe(write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                                   train={**S2, "steps": 1, "warmup_steps": 1},
                                   model={"name": str(tiny_dir), "dtype": "float32",
                                          "gradient_checkpointing": True})) is not None
    said = [str(w.message) for w in recwarn if issubclass(w.category, FutureWarning)]
    assert not [m for m in said if "checkpointing" in m], said


def test_longce_with_pose_resumes_bit_exact_and_says_so_on_the_card(tmp_path, tiny_dir, text_file):  # noqa: F811
    _, _, out = straight_and_resumed(tmp_path, tiny_dir, text_file, train=LONGCE)
    card = (out / "README.md").read_text()
    assert "LongCE (Fang et al. 2025): each token's loss weighted by min(P(long) / P(short), 3), the short " \
           "context 16-23 tokens" in card
    plain = run_recipe(write_config(tmp_path / "ce" / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                                    train={**LONGCE, "loss": "ce", "steps": 1, "warmup_steps": 1}))
    assert plain is not None
    assert ckpt.read_log(tmp_path / "ce" / "out")[0]["loss"] != ckpt.read_log(out)[0]["loss"]


def test_the_card_names_the_longce_floor():
    from hf_posenc.train.losses import LongCE
    from hf_posenc.recipes.finetune_long import LongTraining

    assert "weighted by min(P(long) / P(short), 3), the short context 16-23" in LongTraining(
        loss=LongCE(16, 8, 3.0)).describe()
    assert "weighted by max(min(P(long) / P(short), 3), 1), the short context 16-23" in LongTraining(
        loss=LongCE(16, 8, 3.0, 1.0)).describe()


def test_s2_with_lora_plus_in_two_processes_matches_one(tmp_path, tiny_dir, text_file):  # noqa: F811
    """DDP over gloo: the LoRA adapters, embeddings and norms get their gradients through the groups on each
    process, and two processes of batch 2 train what one of batch 4 does."""
    from test_finetune import two_processes
    from transformers import AutoModelForCausalLM

    common = dict(data={"corpus": str(text_file)}, train={**S2, "steps": 3, "grad_accum": 1, "save_every": 3})
    one = write_config(tmp_path / "one" / "c.yaml", tiny_dir, **common)
    run_recipe(one, "--train.batch_size", "4")
    proc = two_processes(write_config(tmp_path / "two" / "c.yaml", tiny_dir, **common), "--train.batch_size", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 processes" in proc.stdout and "S2-Attn (LongLoRA) in training" in proc.stdout
    log1, log2 = ckpt.read_log(tmp_path / "one" / "out"), ckpt.read_log(tmp_path / "two" / "out")
    assert [r["loss"] for r in log2] == pytest.approx([r["loss"] for r in log1], rel=2e-5)
    w1 = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "out").state_dict()
    w2 = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "out").state_dict()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=k)


# ------------------------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=TINY_TEXT_VOCAB,
                               bos_token_id=256, eos_token_id=256)).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def one_head_dir(tmp_path_factory):
    from tiny import tiny_model

    folder = tmp_path_factory.mktemp("one_head")
    tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=128, num_attention_heads=1, num_key_value_heads=1,
               head_dim=64).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


BAD = [
    ({"train": {"attention": "s2", "s2_group": 24}}, "train.s2_group=24: group=24 does not divide the sequence of 64"),
    ({"train": {"attention": "s2", "s2_group": 128}}, "group=128 is larger than the sequence of 64 tokens"),
    ({"train": {"attention": "s2", "s2_group": 16}, "data": {"short_share": 0.2, "short_len": 40}},
     "does not divide the sequence of 40 tokens into whole groups; choose a divisor of 40 (a quarter: 10) "
     "(data.short_len=40)"),
    ({"train": {"attention": "s2"}, "posenc": {"method": "alibi"}},
     "train.attention=s2 cannot train posenc method 'alibi': it is an attention method"),
    ({"train": {"attention": "s2"}, "posenc": {"method": "dca", "max_position_embeddings": 256}},
     "cannot train posenc method 'dca'"),
    ({"train": {"attention": "s2", "positions": "pose chunks=2"}},
     "spreads a window's ids so that its long distances lie between its chunks"),
    ({"train": {"attention": "s2", "loss": "longce", "longce_window": 16}}, "do not go together"),
    ({"train": {"attention": "s2"}, "model": "ONE_HEAD"},
     "it has one attention head: there is no second half of the heads to shift"),
    ({"train": {"attention": "sparse"}}, "train.attention must be one of full, s2"),
    ({"train": {"s2_group": 1}}, "train.s2_group must be an int >= 2"),
    ({"train": {"loss": "no_such_loss"}}, "train.loss must be one of ce, longce"),
    ({"train": {"loss": "longce"}},
     "train.longce_window=128 (its default: the original context) + train.longce_stride=128 must be below "
     "data.seq_len=64"),
    ({"train": {"loss": "longce", "longce_clip": 0.5}}, "train.longce_clip must be a number >= 1"),
    ({"train": {"loss": "longce", "longce_floor": 2}}, "train.longce_floor must be a number in [0, 1]"),
    ({"train": {"loss": "longce", "longce_window": 16}, "model": "GPT2", "posenc": None},
     "train.loss=longce compares each token's loss given a short window at the same positions"),
]


@pytest.mark.parametrize("sections, message", BAD, ids=[b[1][:30] for b in BAD])
def test_configs_that_cannot_work_are_refused_with_nothing_written(tmp_path, tiny_dir, gpt2_dir, one_head_dir,  # noqa: F811
                                                                    text_file, sections, message):
    sections = {"data": {"corpus": str(text_file), **sections.get("data", {})},
                **{k: v for k, v in sections.items() if k != "data"}}
    folders = {"GPT2": gpt2_dir, "ONE_HEAD": one_head_dir}
    if sections.get("model") in folders:
        sections["model"] = {"name": str(folders[sections["model"]]), "dtype": "float32"}
    cfg = write_config(tmp_path / "cfg" / "c.yaml", tiny_dir, **sections)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as refused:
        run_recipe(cfg)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before   # nothing written


def test_the_script_refuses_in_one_line_with_exit_code_2(tmp_path, tiny_dir, text_file):  # noqa: F811
    cfg = write_config(tmp_path / "cfg" / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                       train={"attention": "s2", "s2_group": 48})
    done = subprocess.run([sys.executable, str(RECIPE), "--config", str(cfg)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: train.s2_group=48: group=48 does not divide") and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_summary_names_the_options(tmp_path, tiny_dir, text_file, capsys):  # noqa: F811
    from hf_posenc.recipes.finetune_config import parse_config
    from hf_posenc.recipes.finetune_checks import check_config
    from hf_posenc.recipes.finetune_recipe import run_summary

    cfg = parse_config(["--config", str(write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                                                     train={"attention": "s2"}))])
    preflight = check_config(cfg)
    assert preflight.long_training.s2_group == 16   # a quarter of data.seq_len
    assert "S2-Attn (LongLoRA) in training: attention inside groups of 16 tokens" in run_summary(cfg, preflight, 1)
    assert json.loads(json.dumps(cfg.to_dict()))["train"]["attention"] == "s2"


def test_the_summary_names_long_training_settings_without_their_switch(tmp_path, tiny_dir, text_file):  # noqa: F811
    """`--train.longce_floor 1` without `--train.loss longce` trains the plain loss: the summary says so."""
    from hf_posenc.recipes.finetune_checks import check_config
    from hf_posenc.recipes.finetune_config import parse_config
    from hf_posenc.recipes.finetune_recipe import run_summary

    def summary(**train):
        cfg = parse_config(["--config", str(write_config(tmp_path / "c.yaml", tiny_dir,
                                                         data={"corpus": str(text_file)}, train=train))])
        return run_summary(cfg, check_config(cfg), 1)

    said = summary(longce_floor=1.0, longce_window=16, s2_group=16, s2_shift=False)
    assert ("  not used: train.s2_group=16 (train.attention is full), train.s2_shift=False (train.attention is "
            "full), train.longce_window=16 (train.loss is ce), train.longce_floor=1.0 (train.loss is ce)") in said
    assert "not used" not in summary(loss="longce", longce_floor=1.0, longce_window=16, longce_stride=8)
    assert "not used" not in summary(longce_clip=5.0)   # a default, written out
