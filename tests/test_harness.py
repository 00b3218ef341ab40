"""lm-evaluation-harness on patched models: the offline long-context tasks, scored as hf_posenc scores them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import hf_posenc as hp  # noqa: E402
from hf_posenc import eval as hpe  # noqa: E402
from hf_posenc import harness  # noqa: E402
from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer  # noqa: E402

ORIGINAL = 256


def patched_model(method="yarn", **params):
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL)
    return hp.patch(model, method, factor=2, **params)


def by_length(samples):
    return sorted(samples, key=lambda s: (s["doc"]["depth"], s["doc_id"]))


def test_lm_eval_scores_the_offline_passkey_as_hf_posenc_does(tmp_path):
    tokenizer, model = tiny_tokenizer(), patched_model()
    lengths, depths = [300, 500], [0.25, 0.75]
    names = harness.write_tasks(tmp_path, tokenizer, lengths=lengths, depths=depths, trials=2)
    assert names == ["hf_posenc_passkey_300", "hf_posenc_passkey_500"]

    lm = harness.HFPosencLM(model, tokenizer)
    assert lm.max_length == 2 * ORIGINAL  # the patched context, not the config's original one
    out = harness.evaluate(lm, tmp_path, log_samples=True)

    for length, name in zip(lengths, names):
        trials = hpe.make_trials("passkey", tokenizer, lengths=[length], depths=depths, trials=2)
        ours = hpe.score_trials(model, trials, progress=False)
        theirs = sorted(out["samples"][name], key=lambda s: s["doc_id"])
        assert len(theirs) == len(ours) == 4
        for trial, mine, sample in zip(trials, ours, theirs):
            assert sample["doc"]["context"] == tokenizer.decode(trial.prompt)
            logprob, greedy = sample["resps"][0][0]
            assert logprob == pytest.approx(mine["logprob"], abs=1e-3)
            assert greedy == mine["correct"]
        accuracy = sum(s["correct"] for s in ours) / len(ours)
        assert out["results"][name]["acc,none"] == pytest.approx(accuracy)
    assert out["results"][harness.GROUP]["sample_len"] == 8


def test_plain_hflm_truncates_where_the_patched_context_does_not(tmp_path):
    """lm-eval sized from the original context left-truncates a 500-token trial: another log-prob."""
    from lm_eval.models.huggingface import HFLM

    tokenizer, model = tiny_tokenizer(), patched_model()
    harness.write_tasks(tmp_path, tokenizer, lengths=[500], depths=[0.5], trials=1)
    ours = harness.evaluate(harness.HFPosencLM(model, tokenizer), tmp_path, log_samples=True)
    short = harness.evaluate(HFLM(pretrained=model, tokenizer=tokenizer, max_length=ORIGINAL, device="cpu"),
                             tmp_path, log_samples=True)
    [a], [b] = ours["samples"]["hf_posenc_passkey_500"], short["samples"]["hf_posenc_passkey_500"]
    assert a["resps"][0][0][0] != pytest.approx(b["resps"][0][0][0], abs=1e-3)


@pytest.mark.parametrize("method", ["dynamic", "alibi"])
def test_a_checkpoint_stock_transformers_cannot_express_loads_patched(tmp_path, method):
    tokenizer, model = tiny_tokenizer(), patched_model(method) if method == "dynamic" else hp.patch(
        tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL), method)
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    lm = harness.HFPosencLM(str(tmp_path / "ckpt"), dtype="float32")
    assert hp.describe(lm.model)["method"] == method
    assert lm.max_length == hp.describe(model)["max_position_embeddings"]
    ids = torch.arange(40)[None] % TINY_TEXT_VOCAB
    torch.testing.assert_close(lm.model(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_patch_argument_and_bad_input(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=ORIGINAL)
    model.save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    lm = harness.HFPosencLM(str(tmp_path / "plain"), patch="ntk factor=4")
    assert hp.describe(lm.model)["method"] == "ntk" and lm.max_length == 4 * ORIGINAL
    with pytest.raises(hp.UnknownMethodError, match="yrn"):
        harness.HFPosencLM(str(tmp_path / "plain"), patch="yrn factor=4")
    with pytest.raises(TypeError, match="tokenizer"):
        harness.HFPosencLM(model)
    with pytest.raises(ValueError, match="kinds"):
        harness.write_tasks(tmp_path / "t", tokenizer, lengths=[100], kinds=["keypass"])
    with pytest.raises(ValueError, match="lengths"):
        harness.write_tasks(tmp_path / "t", tokenizer, lengths=[0])
    with pytest.raises(ValueError, match="too short"):
        harness.write_tasks(tmp_path / "t", tokenizer, lengths=[20])
    assert not (tmp_path / "t").exists()  # refused before anything was written


def test_lm_eval_command_line_with_the_registered_model(tmp_path):
    tokenizer, model = tiny_tokenizer(), patched_model("dynamic")
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    harness.write_tasks(tmp_path / "tasks", tokenizer, lengths=[300], depths=[0.5], trials=1)
    proc = subprocess.run(
        [sys.executable, "-m", "hf_posenc.harness", "--model", "hf_posenc", "--model_args",
         f"pretrained={tmp_path / 'ckpt'},dtype=float32", "--include_path", str(tmp_path / "tasks"),
         "--tasks", harness.GROUP, "--device", "cpu", "--output_path", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    [result] = list((tmp_path / "out").rglob("results*.json"))
    assert "hf_posenc_passkey_300" in json.loads(result.read_text())["results"]
    missing = subprocess.run([sys.executable, "-m", "hf_posenc.harness", "--model", "hf_posenc", "--model_args",
                              f"pretrained={tmp_path / 'nothing'}", "--tasks", harness.GROUP, "--include_path",
                              str(tmp_path / "tasks")], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith("error: no model at ")
