"""Checkpoints edited or damaged after saving, evaluation past a learned table, and what `hp.unpatch` gives
back after `hp.from_pretrained`. Tiny models built from config."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc import eval as hpe
from hf_posenc.errors import CheckpointMismatchError, CheckpointRecordError, SequenceTooLongError

from tiny import tiny_model, token_ids

N = 32  # the tiny GPT-2's positions


def gpt2(positions: int = N, seed: int = 0):
    torch.manual_seed(seed)
    config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=2, n_head=2, n_positions=positions, vocab_size=100,
                                  bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(config).eval()


def edit_config(folder, change) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


# -- 5c: a record that disagrees with the tensors it describes --------------------------------------

@pytest.mark.parametrize("make", [gpt2, lambda: tiny_model("llama")], ids=["gpt2", "llama"])
def test_relative_bias_record_edited_apart_from_its_tables(tmp_path, make):
    model = make()
    hp.patch(model, "relative_bias", k=4)
    model.save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["hf_posenc"]["params"].update(k=2))
    with pytest.raises(CheckpointMismatchError) as err:
        hp.from_pretrained(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "model.safetensors") in message and "'k': 2" in message
    assert "saved (" in message and "the record gives (" in message and "edited" in message


def test_interpolate_record_edited_to_another_factor(tmp_path):
    """factor 4 / 256 positions written over a table interpolated to 2x: not loaded as a factor-4 patch."""
    model = gpt2()
    hp.patch(model, "interpolate", max_position_embeddings=2 * N)
    model.save_pretrained(tmp_path)
    assert hp.describe(hp.from_pretrained(tmp_path))["factor"] == 2  # as saved, it loads
    edit_config(tmp_path, lambda c: c["hf_posenc"]["params"].update(factor=4.0, max_position_embeddings=4 * N))
    with pytest.raises(CheckpointRecordError) as err:
        hp.from_pretrained(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "config.json") in message
    assert f"{4 * N} positions" in message and f"wpe.weight holds {2 * N} positions" in message


@pytest.mark.parametrize("params,match", [
    ({"factor": 4.0, "max_position_embeddings": 4 * N}, f"wpe.weight holds {2 * N} positions"),
    ({"factor": 4.0}, f"factor=4.0 and max_position_embeddings={2 * N} disagree"),
])
def test_sinusoidal_record_edited_to_another_factor(tmp_path, params, match):
    model = gpt2()
    hp.patch(model, "sinusoidal", factor=2, init="raw")
    model.save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["hf_posenc"]["params"].update(params))
    with pytest.raises(CheckpointRecordError, match=match):
        hp.from_pretrained(tmp_path)


def test_record_whose_parameters_disagree_among_themselves(tmp_path):
    model = gpt2()
    hp.patch(model, "tile", factor=2)
    model.save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["hf_posenc"]["original"].update(positions=N // 2))  # 16 * 2 != 64
    with pytest.raises(CheckpointRecordError, match="config.json.*disagree"):
        hp.from_pretrained(tmp_path)


def test_config_and_record_edited_together_over_the_saved_table(tmp_path):
    """n_positions edited too: transformers' size mismatch, as one error naming the tensor and both shapes."""
    model = gpt2()
    hp.patch(model, "interpolate", max_position_embeddings=2 * N)
    model.save_pretrained(tmp_path)

    def change(config):
        config["hf_posenc"]["params"].update(factor=4.0, max_position_embeddings=4 * N)
        config["n_positions"] = 4 * N
    edit_config(tmp_path, change)
    with pytest.raises(CheckpointMismatchError) as err:
        hp.from_pretrained(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "model.safetensors") in message
    assert f"wpe.weight: saved ({2 * N}, 32), the config gives ({4 * N}, 32)" in message


@pytest.mark.parametrize("keep", [4, 100, 2000, -100])  # bytes kept (negative: all but the last 100)
@pytest.mark.parametrize("patched", [True, False])
def test_truncated_weights_name_the_file(tmp_path, keep, patched):
    model = gpt2()
    if patched:
        hp.patch(model, "interpolate", factor=2)
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:keep])
    with pytest.raises(CheckpointMismatchError) as err:
        hp.from_pretrained(tmp_path)
    assert str(weights) in str(err.value) and "truncated" in str(err.value)


# -- 6: evaluation past an unpatched learned table ---------------------------------------------------

EVALUATIONS = {
    "token_nll": lambda m, doc: hpe.token_nll(m, doc),
    "document_perplexity": lambda m, doc: hpe.document_perplexity(m, [doc[:10], doc], max_length=200,
                                                                  progress=False),
    "perplexity_by_length": lambda m, doc: hpe.perplexity_by_length(m, [doc], [16, 200], progress=False),
    "perplexity_curve": lambda m, doc: hpe.perplexity_curve(m, [doc], length=200, bucket=50, progress=False),
    "strided_perplexity": lambda m, doc: hpe.strided_perplexity(m, doc, window=100, stride=50, progress=False),
}


@pytest.mark.parametrize("name", sorted(EVALUATIONS))
def test_evaluation_past_a_learned_table_is_refused_before_any_forward(name):
    model = gpt2()
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    doc = token_ids(200, vocab=100)[0].tolist()
    with pytest.raises(SequenceTooLongError, match=f"holds {N} positions") as err:
        EVALUATIONS[name](model, doc)
    with pytest.raises(SequenceTooLongError) as direct:
        hp.check_length(model, len(doc) if name != "strided_perplexity" else 100)
    assert str(err.value) == str(direct.value) and not calls


def test_evaluation_within_a_learned_table_still_runs():
    model = gpt2()
    doc = token_ids(N, vocab=100)[0].tolist()
    assert hpe.document_perplexity(model, [doc], max_length=N, progress=False)["tokens"] == N - 1
    assert hpe.strided_perplexity(model, token_ids(200, vocab=100)[0].tolist(), window=N, stride=16,
                                  progress=False)["window"] == N


# -- 7b: hp.unpatch of a model hp.from_pretrained loaded ----------------------------------------------

@pytest.mark.parametrize("method,params", [("interpolate", {}), ("sinusoidal", {"init": "fit"}), ("tile", {})])
def test_unpatch_after_reload_gives_the_stock_load_of_the_saved_table_and_says_so(tmp_path, method, params):
    """The folder holds the table the patch made, not the original: unpatch gives what stock transformers
    loads from it (documented in docs/patching.md and docs/learned_tables.md), with a warning saying so."""
    original = gpt2()
    ids = token_ids(N, vocab=100)
    before = logits(original, ids)
    hp.patch(original, method, factor=2, **params)
    original.save_pretrained(tmp_path)
    stock = AutoModelForCausalLM.from_pretrained(tmp_path).eval()

    restored = hp.from_pretrained(tmp_path).eval()
    with pytest.warns(UserWarning, match=r"holds only the position table\(s\) the .* not the model before the patch"):
        hp.unpatch(restored)
    assert torch.equal(logits(restored, ids), logits(stock, ids))
    assert type(restored.transformer.wpe) is torch.nn.Embedding and restored.config.n_positions == 2 * N
    assert not hasattr(restored.config, "hf_posenc")
    if method != "tile":  # tile's first N rows are the old ones: only it gives the old logits inside N
        assert not torch.equal(logits(restored, ids), before)

    with warnings.catch_warnings():  # a patch made in this process: bit for bit, silently
        warnings.simplefilter("error")
        hp.unpatch(original)
    assert torch.equal(logits(original, ids), before)


@pytest.mark.parametrize("make,method", [(lambda: tiny_model("llama"), "yarn"), (gpt2, "alibi")])
def test_unpatch_after_reload_is_bit_for_bit_where_the_folder_holds_the_original(tmp_path, make, method):
    model = make()
    ids = token_ids(N, vocab=100)
    before = logits(model, ids)
    hp.patch(model, method, factor=2)
    model.save_pretrained(tmp_path)
    restored = hp.from_pretrained(tmp_path).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        hp.unpatch(restored)
    assert torch.equal(logits(restored, ids), before)


def test_reload_of_a_copied_folder_still_loads(tmp_path):
    """The checks above refuse edits, not copies: a folder copied whole loads as saved."""
    model = gpt2()
    hp.patch(model, "hierarchical", factor=2)
    model.save_pretrained(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ids = token_ids(2 * N, vocab=100)
    assert torch.equal(logits(hp.from_pretrained(tmp_path / "b").eval(), ids), logits(model, ids))
