"""The fine-tune's mixed context windows (train.mixed_windows, hf_posenc/train/mixed_windows.py) and documents kept
apart (data.packing=documents, hf_posenc/train/documents.py): each against its reference (the unpatched model inside
the original context, the patched one past it; per-document forwards), refused pairings, a resume that ends
as the uninterrupted run, bit for bit, and bad arguments to the window draw refused in one line."""

import pytest
import torch
import torch.nn.functional as F

import hf_posenc as hp
from hf_posenc.train import checkpoints as ckpt
from hf_posenc.train import documents, mixed_windows, data as train_data
from hf_posenc.errors import ConfigError, MethodNotApplicableError
from hf_posenc.train.losses import TrainingLoss
from hf_posenc.recipes import finetune_checks as checks
from hf_posenc.recipes import finetune_config as FC
from hf_posenc.recipes.finetune_recipe import window_batch
from refusals import CallCase, refused_in_one_line
from test_finetune import run_recipe, state, text_file, tiny_dir, write_config  # noqa: F401 (fixtures)
from test_rope_families import FAMILIES, REFUSED, build
from tiny import tiny_model, token_ids

CTX = 64   # the tiny models' original context (tiny.TINY)


# ------------------------------------------------------------------------------------------ mixed windows

@pytest.mark.parametrize("method, params", [("yarn", {}), ("ntk", {}), ("linear", {}), ("llama3", {}),
                                            ("yarn", {"attention_factor": 1.2})])
@pytest.mark.parametrize("family", [f for f in sorted(FAMILIES) if "layer_types" not in FAMILIES[f]])
def test_switched_patch_is_the_unpatched_model_inside_and_the_method_past_the_original_context(family, method,
                                                                                               params):
    if {"longrope", method} & REFUSED.get(family, set()):
        pytest.skip(f"{family}'s config refuses {method} or longrope")
    model = build(family)
    params = {"max_position_embeddings": 2 * CTX, **params}
    short, long = token_ids(CTX - 8), token_ids(3 * CTX // 2, seed=1)
    with torch.no_grad():
        unpatched = model(short).logits
        with hp.patched(model, method, **params) as patched:
            rescaled = patched(long).logits
            attention = next(m for m in patched.modules() if hasattr(m, "attention_scaling")).attention_scaling
        switched = mixed_windows.switched_params(model, method, params)
        assert switched["short_factor"] == [1.0] * len(switched["long_factor"])
        assert switched["attention_factor"] == params.get("attention_factor", 1.0)
        if switched["attention_factor"] == 1.0:   # inside the original context: the unpatched model
            with hp.patched(model, "longrope", **switched) as patched:
                torch.testing.assert_close(patched(short).logits, unpatched, rtol=0, atol=1e-5)
        # with the method's own attention factor the long set is the method itself
        with hp.patched(model, "longrope", **{**switched, "attention_factor": attention}) as patched:
            torch.testing.assert_close(patched(long).logits, rescaled, rtol=0, atol=1e-4)


@pytest.mark.parametrize("method", ["dca", "self_extend", "dynamic", "dynamic_yarn", "alibi"])
def test_a_method_without_a_short_rope_is_refused(method):
    with pytest.raises(MethodNotApplicableError, match="short rope|fixed long rope"):
        mixed_windows.switched_params(tiny_model(), method, {"max_position_embeddings": 2 * CTX})


def test_the_short_share_is_drawn_per_micro_batch_from_the_seed():
    draws = [mixed_windows.drawn_short(seed=3, index=i, share=0.3) for i in range(4000)]
    assert abs(sum(draws) / len(draws) - 0.3) < 0.03
    assert draws == [mixed_windows.drawn_short(seed=3, index=i, share=0.3) for i in range(4000)]
    assert draws != [mixed_windows.drawn_short(seed=4, index=i, share=0.3) for i in range(4000)]
    assert not any(mixed_windows.drawn_short(seed=3, index=i, share=0.0) for i in range(100))


def mixed_config(tmp_path, tiny_dir, text_file, name="mixed", **train):
    return write_config(tmp_path / name / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                        train={"positions": "pose chunks=2", "mixed_windows": 0.5, **train})


def test_mixed_windows_cut_a_short_micro_batch_and_spread_a_long_one(tmp_path, tiny_dir, text_file):
    cfg = FC.parse_config(["--config", str(mixed_config(tmp_path, tiny_dir, text_file))])
    preflight = checks.check_config(cfg)
    assert preflight.long_training.switched["short_factor"] == [1.0] * 8
    batch = {"input_ids": torch.arange(128).view(2, 64), "attention_mask": torch.ones(2, 64, dtype=torch.long)}
    kinds = set()
    for step in range(1, 7):
        for micro in range(2):
            out = window_batch(preflight, batch, cfg, _Process(), step, micro)
            index = (step - 1) * 2 + micro
            short = mixed_windows.drawn_short(seed=3, index=index, share=0.5)
            kinds.add(short)
            if short:
                assert "position_ids" not in out and torch.equal(out["input_ids"], batch["input_ids"])
            else:   # the scheme's ids (a draw may stay inside the original context: the short rope reads it)
                expected = preflight.positions.add_position_ids(batch, seed=3, first_index=index * 2, window=64)
                assert torch.equal(out["position_ids"], expected["position_ids"])
    assert kinds == {True, False}


class _Process:
    num_processes, process_index = 1, 0


def stopped_and_resumed(tmp_path, config) -> tuple[dict, object]:
    """A run straight through (`config("full")`) and the same run stopped after step 3 and resumed
    (`config("cut")`): their losses are equal, and so are their weights, bit for bit. Returns (the full run's
    state, the resumed model)."""
    full = run_recipe(config("full"))
    cut_cfg = config("cut")
    assert run_recipe(cut_cfg, "--train.stop_after_steps", "3") is None
    resumed = run_recipe(cut_cfg, "--resume")
    full_log, resumed_log = (ckpt.read_log(tmp_path / n / "out") for n in ("full", "cut"))
    assert [r["loss"] for r in resumed_log] == [r["loss"] for r in full_log]
    a, b = state(full), state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    return a, resumed


def test_mixed_windows_resume_bit_exact_and_save_a_stock_switched_longrope(tmp_path, tiny_dir, text_file):
    _, resumed = stopped_and_resumed(tmp_path, lambda name: mixed_config(tmp_path, tiny_dir, text_file, name))
    from transformers import AutoModelForCausalLM

    out = tmp_path / "cut" / "out"
    stock = AutoModelForCausalLM.from_pretrained(out).eval()
    rope = stock.config.rope_parameters
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == [1.0] * len(rope["long_factor"])
    assert "saved as a switched `longrope`" in (out / "README.md").read_text()   # the card says what it is
    for n in (100, 200):   # inside the original 128 (short factors) and past it (long)
        ids = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            torch.testing.assert_close(stock(ids).logits, resumed.eval()(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("overrides, message", [
    ({"train": {"mixed_windows": 0.5}}, "stays inside the original context"),            # contiguous 64 < 128
    ({"train": {"mixed_windows": 1.0}}, r"a share in \[0, 1\)"),
    ({"train": {"mixed_windows": -0.1}}, r"a share in \[0, 1\)"),
    ({"train": {"mixed_windows": 0.5, "positions": "pose"}, "posenc": None}, "needs a posenc patch"),
    ({"train": {"mixed_windows": 0.5}, "data": {"seq_len": 192},
      "posenc": {"method": "dynamic_yarn", "max_position_embeddings": 256}}, "fixed long rope"),
    ({"train": {"mixed_windows": 0.5, "positions": "pose"}, "data": {"short_share": 0.25, "short_len": 32}},
     "both set a share of short windows"),
    ({"data": {"packing": "documents"}, "train": {"positions": "pose"}, "model": {"attn_implementation": "eager"}},
     "only hf_posenc's attention per document reads as one document"),
    ({"data": {"packing": "documents"}, "train": {"attention": "s2"}}, "train.attention=s2"),
    ({"data": {"packing": "documents"}, "posenc": {"method": "self_extend", "max_position_embeddings": 256}},
     "computes attention itself"),
    ({"data": {"packing": "documents"}, "model": {"attn_implementation": "paged|sdpa"}}, "cannot keep documents"),
    ({"data": {"packing": "documents", "seq_len": 192}, "train": {"mixed_windows": 0.5}}, "follow its longest document"),
    ({"data": {"packing": "packed"}}, "data.packing must be one of joined, documents"),
    ({"data": {"seq_len": 192}, "train": {"mixed_windows": 0.5, "attention": "s2", "s2_group": 48}},
     r"train.s2_group=48: .*\(train.mixed_windows' short window length=128\)"),   # not data.short_len: unset
])
def test_a_window_mix_or_packing_that_cannot_work_is_refused_before_loading(tmp_path, tiny_dir, text_file,
                                                                            overrides, message):
    sections = {"data": {"corpus": str(text_file), **overrides.pop("data", {})}, **overrides}
    path = write_config(tmp_path / "c.yaml", tiny_dir, **sections)
    with pytest.raises(ConfigError, match=message):
        checks.check_config(FC.parse_config(["--config", str(path)]))
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------------- documents apart

def test_the_loss_of_a_packed_window_is_the_documents_own_losses():
    model = tiny_model()
    eos, g = 3, torch.Generator().manual_seed(0)
    docs = [torch.randint(4, 128, (n,), generator=g) for n in (11, 17, 6)]
    rows = [torch.cat([docs[0], torch.tensor([eos]), docs[1], torch.tensor([eos])]).tolist(),
            torch.cat([docs[2], torch.tensor([eos])]).tolist()]   # the second row padded
    batch = train_data.collate(0, eos)([{"input_ids": r} for r in rows])
    loss = TrainingLoss(model, objective="lm", causal=True, documents=True)(
        batch["input_ids"], batch["attention_mask"], position_ids=batch["position_ids"])
    total, count = 0.0, 0
    with torch.no_grad():
        for doc in docs:   # each document with its EOS, alone
            ids = torch.cat([doc, torch.tensor([eos])])[None]
            logits = model(ids).logits[0, :-1]
            total += F.cross_entropy(logits, ids[0, 1:], reduction="sum")
            count += ids.shape[1] - 1
    torch.testing.assert_close(loss, total / count, rtol=1e-5, atol=1e-6)
    plain = train_data.collate(0)([{"input_ids": r} for r in rows])
    with torch.no_grad():
        joined = TrainingLoss(model, objective="lm", causal=True)(plain["input_ids"], plain["attention_mask"])
    assert abs(float(joined) - float(total / count)) > 1e-3   # joined, the later documents read the earlier ones


def test_the_loss_of_spread_ids_inside_documents_is_each_documents_own_at_its_ids():
    """PoSE ids inside documents kept apart (SDPA per document): the window's loss is, token for token, each
    document's piece run alone at its own spread ids, its first token here unscored."""
    from hf_posenc.train.positions import scheme

    model = tiny_model()
    assert documents.use_per_document(model)
    eos, g = 3, torch.Generator().manual_seed(1)
    docs = [torch.randint(4, 128, (n,), generator=g) for n in (30, 9, 40)]
    row = torch.cat([docs[0], torch.tensor([eos]), docs[1], torch.tensor([eos]), docs[2]])
    collated = train_data.collate(0, eos, document_numbers=True)([{"input_ids": row.tolist()}])
    batch = documents.spread_in_documents(collated, scheme("pose chunks=2", target=512), seed=0, first_index=2,
                                          window=len(row))
    ids, mask = batch["position_ids"][0], batch["attention_mask"][0]
    assert ids.max() > len(docs[0])   # the ids jump inside a document: far pairs trained
    loss = TrainingLoss(model, objective="lm", causal=True, documents=True)(
        batch["input_ids"], batch["attention_mask"], position_ids=batch["position_ids"])
    total, count, start = 0.0, 0, 0
    with torch.no_grad():
        for end in [*(torch.nonzero(ids[1:] == 0).flatten() + 1).tolist(), len(row)]:   # each document alone
            piece, at = row[start:end][None], ids[start:end][None]
            logits = model(input_ids=piece, attention_mask=torch.ones_like(piece), position_ids=at).logits[0, :-1]
            scored = mask[start + 1:end].bool()
            total += F.cross_entropy(logits[scored], piece[0, 1:][scored], reduction="sum")
            count += int(scored.sum())
            start = end
    torch.testing.assert_close(loss, total / count, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory, text_file):
    """30 documents of 20 to 78 bytes: most 64-token windows hold two or three."""
    folder = tmp_path_factory.mktemp("short_documents")
    text = (text_file / "a.txt").read_text()
    for i in range(30):
        (folder / f"{i:02d}.txt").write_text(text[i * 80: i * 80 + 20 + 2 * i])
    return folder


def documents_config(tmp_path, tiny_dir, corpus, name, **train):
    return write_config(tmp_path / name / "c.yaml", tiny_dir, data={"corpus": str(corpus), "packing": "documents"},
                        train={"loss": "longce", "longce_window": 16, **train})


def test_documents_apart_resume_bit_exact(tmp_path, tiny_dir, short_documents):
    a, _ = stopped_and_resumed(tmp_path, lambda name: documents_config(tmp_path, tiny_dir, short_documents, name))
    # and the documents were kept apart: the joined run trains other weights
    joined = run_recipe(write_config(tmp_path / "joined" / "c.yaml", tiny_dir, data={"corpus": str(short_documents)},
                                     train={"loss": "longce", "longce_window": 16}))
    assert any(not torch.equal(a[k], v) for k, v in state(joined).items())


def test_spread_ids_inside_documents_resume_bit_exact(tmp_path, tiny_dir, short_documents):
    """PoSE's spread ids taken from spans (text=span) inside the documents kept apart: the run resumes bit for bit,
    and trains other weights than the same spans with their documents joined."""
    def config(name, packing="documents"):
        return write_config(tmp_path / name / "c.yaml", tiny_dir,
                            data={"corpus": str(short_documents), "packing": packing},
                            train={"positions": "pose chunks=2 text=span target=96", "loss": "longce",
                                   "longce_window": 16})

    a, _ = stopped_and_resumed(tmp_path, config)
    assert "only a document that spans those ids trains their distance" in (tmp_path / "full/out/README.md").read_text()
    cfg = FC.parse_config(["--config", str(config("check"))])
    preflight = checks.check_config(cfg)
    assert "documents kept apart" in preflight.long_training.describe()
    span = torch.randint(4, 128, (2, 96), generator=torch.Generator().manual_seed(0))
    span[:, 40] = 3   # a document ends inside each span
    batch = train_data.collate(0, 3, document_numbers=True)([{"input_ids": r} for r in span.tolist()])
    out = window_batch(preflight, batch, cfg, _Process(), 2, 1)   # step 2, micro 1: windows 6 and 7
    expected = documents.spread_in_documents(batch, preflight.positions, seed=3, first_index=6, window=64)
    assert all(torch.equal(out[k], v) for k, v in expected.items()) and out.keys() == expected.keys()
    joined = run_recipe(config("joined", "joined"))
    assert any(not torch.equal(a[k], v) for k, v in state(joined).items())


def test_position_ids_of_the_collate_restart_at_each_document():
    batch = train_data.collate(0, 9)([{"input_ids": [5, 6, 9, 7, 8, 9, 4]}, {"input_ids": [1, 9, 2]}])
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 0], [0, 1, 0, 0, 1, 2, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0]]
    assert documents.document_index(batch["position_ids"]).tolist() == [[0, 0, 0, 1, 1, 1, 2], [0, 0, 1, 2, 2, 2, 2]]
    assert "document" not in batch   # a batch a model takes as it is (model(**batch))
    numbered = train_data.collate(0, 9, document_numbers=True)([{"input_ids": [5, 6, 9, 7, 8, 9, 4]},
                                                                {"input_ids": [1, 9, 2]}])
    assert numbered["document"].tolist() == [[0, 0, 0, 1, 1, 1, 2], [0, 0, 1, -1, -1, -1, -1]]   # -1: padding


@pytest.mark.parametrize("setting", ["mixed", "documents"])
def test_kill_9_resumes_to_the_uninterrupted_run(tmp_path, tiny_dir, text_file, short_documents, setting):
    """Each new setting (mixed windows on windows of 192 tokens past the original 128, so that it has long ones to
    mix with; documents apart on short documents), the run killed with SIGKILL between checkpoints; --resume ends
    with the uninterrupted run's losses and weights, bit for bit."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from test_finetune import RECIPE

    sections = ({"data": {"corpus": str(text_file), "seq_len": 192}, "train": {"mixed_windows": 0.5}}
                if setting == "mixed" else {"data": {"corpus": str(short_documents), "packing": "documents"}, "train": {}})

    def config(name):
        return write_config(tmp_path / name / "c.yaml", tiny_dir, data=sections["data"],
                            train={**sections["train"], "steps": 8, "save_every": 1, "batch_size": 1,
                                   "scheduler": "constant_with_warmup"})

    killed = config("killed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    child = subprocess.Popen([sys.executable, str(RECIPE), "--config", str(killed)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out, deadline = tmp_path / "killed" / "out", time.monotonic() + 240
    try:
        while len(ckpt.read_log(out)) < 3 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        child.kill()
    assert 3 <= len(ckpt.read_log(out)) < 8
    resumed = run_recipe(killed, "--resume")
    whole = run_recipe(config("whole"))
    assert [r["loss"] for r in ckpt.read_log(out)] == [r["loss"] for r in ckpt.read_log(tmp_path / "whole" / "out")]
    a, b = state(whole), state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_longce_short_windows_read_with_the_long_pass_rope_under_a_switched_patch():
    """A long micro-batch of a mixed-windows run: LongCE's short windows whose ids stay inside the original
    context must not turn the switched rope to its short set (they would differ from the long pass by the rope,
    not by the context alone): each short window is scored as the static long rope scores it."""
    from hf_posenc.causal_lm import short_context_losses

    model = tiny_model()
    ids = token_ids(3 * CTX // 2, seed=2)
    positions = torch.arange(ids.shape[1])[None]
    mask = torch.ones_like(ids)
    switched = mixed_windows.switched_params(model, "yarn", {"max_position_embeddings": 2 * CTX})
    with torch.no_grad():
        with hp.patched(model, "longrope", **{**switched, "short_factor": switched["long_factor"]}) as static:
            expected = short_context_losses(static, ids, mask, 16, 16, positions)
        with hp.patched(model, "longrope", **switched) as patched:
            got = short_context_losses(patched, ids, mask, 16, 16, positions)
    scored = ~expected.isnan()
    assert scored[:, :CTX].any()   # windows that end inside the original context are among them
    torch.testing.assert_close(got[scored], expected[scored], rtol=1e-4, atol=1e-4)


# -- wrong-type and out-of-range input to the window draw: one line naming the argument ---------------------------

CALL_CASES = [
    # train.mixed_windows
    CallCase("drawn_short-share-a-str", lambda: mixed_windows.drawn_short(seed=0, index=0, share="0.5"),
             hp.ParameterTypeError, "share must be a number"),
    CallCase("drawn_short-seed-none", lambda: mixed_windows.drawn_short(seed=None, index=0, share=0.5),
             hp.InvalidParameterError, "seed is required"),
    CallCase("drawn_short-index-negative", lambda: mixed_windows.drawn_short(seed=0, index=-1, share=0.5),
             hp.InvalidParameterError, "index must be >= 0"),
    CallCase("drawn_short-index-a-float", lambda: mixed_windows.drawn_short(seed=0, index=2.5, share=0.5),
             hp.ParameterTypeError, "index must be an int"),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[c.id for c in CALL_CASES])
def test_bad_input_to_the_python_api_is_refused_in_one_line(case):
    refused_in_one_line(case)
