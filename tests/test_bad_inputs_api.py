"""Bad input to the library, as a hostile new user would give it: every case names the call,
the error class and what its message must say, and checks that nothing changed (the model's tensors and
config, the files on disk). Then the behaviours those cases led to: unpatch after hp.from_pretrained,
numpy / torch parameters that save, checkpoint records that lie, a PEFT-wrapped model, a patch in
the middle of training."""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_learned import tiny
from tiny import tiny_model, tiny_tokenizer, token_ids
from torch import nn
from transformers import AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc import _compat
from hf_posenc import eval as hpe
from hf_posenc.corpora import load_corpus
from hf_posenc.methods.learned import ORIGINAL_TABLE
from hf_posenc.plan import is_patched


def build(kind: str | None):
    if kind is None:
        return None
    if kind == "llama":
        return tiny_model()
    if kind == "llama_yarn":
        return hp.patch(tiny_model(), "yarn", factor=2)
    return tiny(kind)


def model_state(model) -> tuple[dict, dict] | None:
    if not isinstance(model, nn.Module):
        return None
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model.config.to_dict()


def files_state(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_model(before, after) -> None:
    if before is None:
        return
    (tensors, config), (tensors_after, config_after) = before, after
    assert config_after == config
    assert tensors_after.keys() == tensors.keys()
    assert all(torch.equal(tensors_after[k], v) for k, v in tensors.items())


# -- checkpoints to break --------------------------------------------------------------------------

def saved(path: Path, kind: str, method: str, **params) -> Path:
    """`kind` patched with `method`, saved in path / "ck"."""
    model = build(kind)
    hp.patch(model, method, **params)
    model.save_pretrained(path / "ck")
    return path / "ck"


def edit_config(folder: Path, edit: Callable[[dict], None]) -> Path:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def edited_record(kind: str, method: str, params: dict, edit: Callable[[dict], None]):
    """A setup: the saved checkpoint, its config.json edited by `edit(config_dict)`."""
    return lambda path: edit_config(saved(path, kind, method, **params), edit)


def set_record(value):
    return lambda c: c.update(hf_posenc=value)


def set_in(*keys, value):
    def edit(c):
        node = c["hf_posenc"]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return edit


def drop(*keys):
    def edit(c):
        node = c["hf_posenc"]
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
    return edit


def yarn_says_linear(c):
    """The record says linear, rope_parameters (what stock transformers reads) still say yarn."""
    record = c["hf_posenc"]
    record["method"] = "linear"
    record["params"] = {k: v for k, v in record["params"].items()
                        if k in ("max_position_embeddings", "factor", "layer_types", "replace_native")}


def without_original_table(path: Path) -> Path:
    """An alibi GPT-2 checkpoint as hf_posenc saved it before it kept the removed table."""
    folder = saved(path, "gpt2", "alibi")
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.endswith(ORIGINAL_TABLE)}, folder / "model.safetensors",
              metadata={"format": "pt"})
    return folder


def text_file(name: str, content: bytes):
    def setup(path: Path) -> Path:
        (path / name).write_bytes(content)
        return path / name
    return setup


def empty_folder(path: Path) -> Path:
    (path / "empty").mkdir()
    return path / "empty"


def folder_with(name: str):
    def setup(path: Path) -> Path:
        (path / "m").mkdir()
        (path / "m" / name).write_text("{}")
        return path / "m"
    return setup


# -- the cases -------------------------------------------------------------------------------------

@dataclass
class Case:
    id: str
    call: Callable[[Any], Any]  # given ctx: ctx.model (built from `model`), ctx.path (from `setup`), ctx.tmp
    error: type
    match: str  # a substring the message must hold
    model: str | None = None
    setup: Callable[[Path], Path] | None = None


P = hp.patch
YARN_RECORD = ("llama", "yarn", {"factor": 2})
CASES = [
    # item 9: what is not a model
    Case("patch-nn-linear", lambda c: P(nn.Linear(2, 2), "yarn", factor=2), hp.UnsupportedModelError,
         "needs a transformers model"),
    Case("patch-a-name", lambda c: P("llama", "yarn", factor=2), hp.UnsupportedModelError, "hp.load_model('llama')"),
    Case("patch-none", lambda c: P(None, "yarn", factor=2), hp.UnsupportedModelError, "got NoneType"),
    Case("unpatch-a-name", lambda c: hp.unpatch("x"), hp.UnsupportedModelError, "hp.unpatch needs a transformers"),
    Case("unpatch-none", lambda c: hp.unpatch(None), hp.UnsupportedModelError, "hp.unpatch needs a transformers"),
    Case("unpatch-nn-linear", lambda c: hp.unpatch(nn.Linear(2, 2)), hp.UnsupportedModelError, "got Linear"),
    Case("describe-a-name", lambda c: hp.describe("x"), hp.UnsupportedModelError, "hp.describe needs"),
    Case("describe-nn-linear", lambda c: hp.describe(nn.Linear(2, 2)), hp.UnsupportedModelError, "hp.describe needs"),
    Case("check-length-a-name", lambda c: hp.check_length("x", 3), hp.UnsupportedModelError, "hp.check_length needs"),
    # numbers
    Case("factor-nan", lambda c: P(c.model, "yarn", factor=float("nan")), hp.InvalidParameterError,
         "factor must be finite", "llama"),
    Case("factor-inf", lambda c: P(c.model, "yarn", factor=float("inf")), hp.InvalidParameterError,
         "factor must be finite", "llama"),
    Case("factor-negative", lambda c: P(c.model, "yarn", factor=-1), hp.InvalidParameterError, "factor must be > 0",
         "llama"),
    Case("factor-below-1", lambda c: P(c.model, "yarn", factor=0.5), hp.InvalidParameterError, "factor must be >= 1",
         "llama"),
    Case("factor-1e30", lambda c: P(c.model, "yarn", factor=1e30), hp.InvalidParameterError,
         "it must be <= 2147483647", "llama"),
    Case("factor-1e308-overflow", lambda c: P(c.model, "linear", factor=1e308), hp.InvalidParameterError,
         "a context of inf tokens", "llama"),
    Case("factor-str", lambda c: P(c.model, "yarn", factor="2"), hp.ParameterTypeError, "factor must be a number",
         "llama"),
    Case("factor-bool", lambda c: P(c.model, "yarn", factor=True), hp.ParameterTypeError, "got True (bool)", "llama"),
    Case("factor-list", lambda c: P(c.model, "yarn", factor=[2]), hp.ParameterTypeError, "factor must be a number",
         "llama"),
    Case("factor-two-element-tensor", lambda c: P(c.model, "yarn", factor=torch.tensor([2.0, 3.0])),
         hp.ParameterTypeError, "factor must be a number, got [2.0, 3.0]", "llama"),
    Case("factor-numpy-array", lambda c: P(c.model, "yarn", factor=np.array([2.0])), hp.ParameterTypeError,
         "factor must be a number", "llama"),
    Case("factor-meta-tensor", lambda c: P(c.model, "yarn", factor=torch.tensor(2.0, device="meta")),
         hp.ParameterTypeError, "factor must be a number", "llama"),
    Case("target-huge", lambda c: P(c.model, "yarn", max_position_embeddings=10**12), hp.InvalidParameterError,
         "max_position_embeddings must be <= 2147483647", "llama"),
    Case("target-negative", lambda c: P(c.model, "yarn", max_position_embeddings=-64), hp.InvalidParameterError,
         "max_position_embeddings must be > 0", "llama"),
    Case("target-shorter", lambda c: P(c.model, "yarn", max_position_embeddings=63), hp.InvalidParameterError,
         "shorter than the model's original context 64", "llama"),
    Case("target-float", lambda c: P(c.model, "yarn", max_position_embeddings=64.0), hp.ParameterTypeError,
         "must be an int", "llama"),
    Case("target-bool", lambda c: P(c.model, "yarn", max_position_embeddings=True), hp.ParameterTypeError,
         "must be an int", "llama"),
    Case("no-target", lambda c: P(c.model, "yarn"), hp.InvalidParameterError, "needs max_position_embeddings=",
         "llama"),
    Case("relative-k-huge", lambda c: P(c.model, "relative_bias", k=10**10), hp.InvalidParameterError,
         "k must be <= 2147483647", "gpt2"),
    Case("longrope-dict", lambda c: P(c.model, "longrope", factor=2, long_factor={1: 2}), hp.ParameterTypeError,
         "long_factor must be a list of numbers", "llama"),
    Case("longrope-2d-tensor", lambda c: P(c.model, "longrope", factor=2, long_factor=torch.ones(2, 4)),
         hp.ParameterTypeError, "long_factor[0] must be a number", "llama"),
    Case("longrope-wrong-length", lambda c: P(c.model, "longrope", factor=2, long_factor=np.ones(3)),
         hp.InvalidParameterError, "long_factor has 3 values", "llama"),
    Case("layer-types-int", lambda c: P(c.model, "yarn", factor=2, layer_types=5), hp.ParameterTypeError,
         "layer_types must be a non-empty list of str", "llama"),
    Case("from-dict-none", lambda c: hp.configs.YarnConfig.from_dict(None), hp.ParameterTypeError,
         "must be a dict, got None"),
    # methods
    Case("method-none", lambda c: P(c.model, None, factor=2), hp.UnknownMethodError, "method must be a name",
         "llama"),
    Case("method-empty", lambda c: P(c.model, "", factor=2), hp.UnknownMethodError, "unknown method ''", "llama"),
    Case("method-upper-case", lambda c: P(c.model, "YARN", factor=2), hp.UnknownMethodError, "unknown method 'YARN'; known: ",
         "llama"),
    Case("method-a-class", lambda c: P(c.model, hp.configs.YarnConfig, factor=2), hp.UnknownMethodError,
         "method must be a name or a method config", "llama"),
    Case("unknown-parameter", lambda c: P(c.model, "yarn", factor=2, bogus=1), hp.InvalidParameterError,
         "unknown parameter(s) ['bogus']", "llama"),
    Case("config-and-keywords", lambda c: P(c.model, hp.configs.YarnConfig(factor=2), factor=3),
         hp.ParameterTypeError, "not both", "llama"),
    Case("rope-method-on-a-table", lambda c: P(c.model, "yarn", factor=2), hp.MethodNotApplicableError,
         "learned positions", "gpt2"),
    Case("already-patched", lambda c: P(c.model, "linear", factor=2), hp.AlreadyPatchedError,
         "already patched (method 'yarn')", "llama_yarn"),
    Case("unpatch-unpatched", lambda c: hp.unpatch(c.model), hp.NotPatchedError, "carries no hf_posenc patch",
         "llama"),
    # item 10: a learned table swapped for rotary positions with no rotary channel
    Case("rope-zero-rotary-channels", lambda c: P(c.model, "rope", partial_rotary_factor=0.01),
         hp.InvalidParameterError, "= 0 rotary channels per head of 16", "gpt2"),
    Case("rope-one-rotary-channel", lambda c: P(c.model, "rope", partial_rotary_factor=0.1),
         hp.InvalidParameterError, "the smallest partial_rotary_factor is 2/16 = 0.125", "bert"),
    # XPos scales past the float range: inf and NaN scores, silently
    Case("xpos-scale-base-tiny", lambda c: P(c.model, "xpos", scale_base=1e-300), hp.InvalidParameterError,
         "Use scale_base >= 0.6681", "llama"),
    Case("xpos-context-past-float-range", lambda c: P(c.model, "xpos", max_position_embeddings=131072),
         hp.InvalidParameterError, "scales q and k by up to e^160 at 131072 tokens", "llama"),
    # check_length
    Case("check-length-negative", lambda c: hp.check_length(c.model, -1), hp.InvalidParameterError,
         "length must be >= 0", "gpt2"),
    Case("check-length-str", lambda c: hp.check_length(c.model, "a"), hp.ParameterTypeError, "length must be an int",
         "gpt2"),
    Case("check-length-none", lambda c: hp.check_length(c.model, None), hp.InvalidParameterError,
         "length is required", "gpt2"),
    Case("check-length-too-long", lambda c: hp.check_length(c.model, 33), hp.SequenceTooLongError,
         "holds 32 positions", "gpt2"),
    # paths
    Case("from-pretrained-missing-path", lambda c: hp.from_pretrained(c.tmp / "nope"), hp.ModelNotFoundError,
         "the path does not exist"),
    Case("from-pretrained-folder-without-config", lambda c: hp.from_pretrained(c.path), hp.ModelNotFoundError,
         "is a folder without config.json", setup=empty_folder),
    Case("from-pretrained-folder-with-a-tokenizer-only", lambda c: hp.from_pretrained(c.path), hp.ModelNotFoundError,
         "is a folder without config.json", setup=folder_with("tokenizer_config.json")),
    Case("from-pretrained-a-peft-adapter-folder", lambda c: hp.from_pretrained(c.path), hp.ModelNotFoundError,
         "it holds a PEFT adapter", setup=folder_with("adapter_config.json")),
    Case("from-pretrained-a-file", lambda c: hp.from_pretrained(c.path), hp.ModelNotFoundError, "m.txt is a file",
         setup=text_file("m.txt", b"{}")),
    Case("from-pretrained-missing-gguf-in-a-folder", lambda c: hp.from_pretrained(c.path, gguf_file="m.gguf"),
         hp.ModelNotFoundError, "GGUF file not found", setup=folder_with("config.json")),
    Case("from-pretrained-none", lambda c: hp.from_pretrained(None), hp.ParameterTypeError, "got None"),
    Case("from-pretrained-empty", lambda c: hp.from_pretrained(""), hp.ModelNotFoundError, "is empty"),
    Case("from-pretrained-int", lambda c: hp.from_pretrained(3), hp.ParameterTypeError, "got 3"),
    Case("from-pretrained-missing-gguf", lambda c: hp.from_pretrained(c.tmp / "m.gguf"), hp.ModelNotFoundError,
         "GGUF file not found"),
    Case("load-model-missing-path", lambda c: hp.load_model("./no/such/model"), hp.ModelNotFoundError,
         "no model at ./no/such/model"),
    Case("load-model-none", lambda c: hp.load_model(None), hp.ParameterTypeError, "a model is a hub id"),
    # item 7: records that lie or are malformed
    Case("record-linear-but-rope-parameters-yarn", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "and its rope_parameters disagree", setup=edited_record(*YARN_RECORD, yarn_says_linear)),
    Case("record-factor-edited", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "'factor': 3.0", setup=edited_record(*YARN_RECORD, lambda r: r["hf_posenc"]["params"].update(
             factor=3.0, max_position_embeddings=192))),
    Case("record-a-string", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "must be a dict, got str 'yarn'", setup=edited_record(*YARN_RECORD, set_record("yarn"))),
    Case("record-a-list", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError, "must be a dict, got list",
         setup=edited_record(*YARN_RECORD, set_record(["yarn"]))),
    Case("record-empty", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError, "lacks the key(s)",
         setup=edited_record(*YARN_RECORD, set_record({}))),
    Case("record-without-family", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "lacks the key(s) ['family']", setup=edited_record(*YARN_RECORD, drop("family"))),
    Case("record-without-params", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "lacks the key(s) ['params']", setup=edited_record(*YARN_RECORD, drop("params"))),
    Case("record-unknown-family", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "unknown family 'nosuch'", setup=edited_record(*YARN_RECORD, set_in("family", value="nosuch"))),
    Case("record-unknown-method", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "unknown method 'nosuch'", setup=edited_record(*YARN_RECORD, set_in("method", value="nosuch"))),
    Case("record-method-not-a-str", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "unknown method 3", setup=edited_record(*YARN_RECORD, set_in("method", value=3))),
    Case("record-wrong-mechanism", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "says mechanism 'learned'", setup=edited_record(*YARN_RECORD, set_in("mechanism", value="learned"))),
    Case("record-method-of-another-mechanism", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "does not apply to rope positions",
         setup=edited_record(*YARN_RECORD, set_in("method", value="interpolate"))),
    Case("record-params-a-list", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "has params [1], not a dict", setup=edited_record(*YARN_RECORD, set_in("params", value=[1]))),
    Case("record-param-of-the-wrong-type", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "factor must be a number, got '2'", setup=edited_record(*YARN_RECORD, set_in("params", "factor", value="2"))),
    Case("record-without-original-rope", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "needs the original rope_parameters", setup=edited_record(*YARN_RECORD, drop("original", "rope_parameters"))),
    Case("record-original-context-a-str", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "needs the original max_position_embeddings",
         setup=edited_record(*YARN_RECORD, set_in("original", "max_position_embeddings", value="64"))),
    Case("record-learned-tables-a-list", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "not a dict of the position tables", setup=edited_record("gpt2", "alibi", {}, set_in("tables", value=["wpe"]))),
    Case("record-stacked-base-malformed", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "'hf_posenc.base' record lacks the key(s) ['method']",
         setup=lambda p: edit_config(stacked(p), drop("base", "method"))),
    Case("describe-malformed-record", lambda c: hp.describe(broken_record(c.model)), hp.CheckpointRecordError,
         "must be a dict, got str", "llama"),
    # item 1: a checkpoint saved before the removed table was kept: it loads, and unpatch says why it cannot
    Case("unpatch-old-checkpoint-without-original-table", lambda c: hp.unpatch(c.loaded), hp.NotPatchedError,
         "unpatching this model would leave a random table", setup=without_original_table),
    # item 9: corpora
    Case("corpus-none", lambda c: load_corpus(None), hp.InvalidInputError, "got None"),
    Case("corpus-empty-string", lambda c: load_corpus(""), hp.InvalidInputError, "got ''"),
    Case("corpus-blank", lambda c: load_corpus("  "), hp.InvalidInputError, "a corpus is"),
    Case("corpus-int", lambda c: load_corpus(3), hp.InvalidInputError, "got 3"),
    Case("corpus-malformed-jsonl", lambda c: load_corpus(str(c.path)), hp.InvalidInputError,
         "a.jsonl cannot be read as JSON", setup=text_file("a.jsonl", b'{"text": "a"}\n{bad\n')),
    Case("corpus-undecodable-txt", lambda c: load_corpus(str(c.path)), hp.InvalidInputError,
         "a.txt cannot be read as UTF-8 text", setup=text_file("a.txt", b"\xff\xfe\xfa\x80abc")),
    Case("corpus-one-bad-file-of-two", lambda c: load_corpus(str(c.path.parent / "*.txt")), hp.InvalidInputError,
         "b.txt cannot be read as UTF-8 text",
         setup=lambda p: (text_file("a.txt", b"fine")(p), text_file("b.txt", b"\xff\xfe")(p))[1]),
    Case("corpus-malformed-parquet", lambda c: load_corpus(str(c.path)), hp.InvalidInputError,
         "a.parquet cannot be read as Parquet", setup=text_file("a.parquet", b"garbage")),
    Case("corpus-text-column-missing", lambda c: load_corpus(str(c.path), text_column="body"), hp.InvalidInputError,
         "has no column 'body'", setup=text_file("a.jsonl", b'{"text": "a"}\n')),
    Case("corpus-unknown-play", lambda c: load_corpus("shakespeare:nosuch"), hp.InvalidInputError,
         "no play(s) ['nosuch']"),
    # item 9 and the sweep: hf_posenc.eval
    Case("token-nll-empty", lambda c: hpe.token_nll(c.model, torch.tensor([], dtype=torch.long)),
         hp.InvalidInputError, "non-empty", "llama"),
    Case("token-nll-empty-row", lambda c: hpe.token_nll(c.model, torch.zeros(1, 0, dtype=torch.long)),
         hp.InvalidInputError, "got shape (1, 0)", "llama"),
    Case("token-nll-float-ids", lambda c: hpe.token_nll(c.model, torch.tensor([1.5, 2.5])), hp.InvalidInputError,
         "of torch.float32", "llama"),
    Case("token-nll-3d", lambda c: hpe.token_nll(c.model, torch.ones(1, 1, 4, dtype=torch.long)),
         hp.InvalidInputError, "got shape (1, 1, 4)", "llama"),
    Case("token-nll-past-the-vocabulary", lambda c: hpe.token_nll(c.model, torch.tensor([1, 500])),
         hp.InvalidInputError, "vocabulary is 0..127", "llama"),
    Case("token-nll-negative-id", lambda c: hpe.token_nll(c.model, torch.tensor([1, -5])), hp.InvalidInputError,
         "token ids -5..1", "llama"),
    Case("token-nll-none", lambda c: hpe.token_nll(c.model, None), hp.InvalidInputError, "got None", "llama"),
    Case("token-nll-chunk-0", lambda c: hpe.token_nll(c.model, torch.arange(10), chunk_size=0),
         hp.InvalidParameterError, "chunk_size must be >= 1", "llama"),
    Case("document-perplexity-no-documents", lambda c: hpe.document_perplexity(c.model, [], max_length=8),
         hp.InvalidInputError, "at least one document", "llama"),
    Case("perplexity-by-length-a-str", lambda c: hpe.perplexity_by_length(c.model, [list(range(10))], ["a"]),
         hp.ParameterTypeError, "lengths[0] must be an int", "llama"),
    Case("strided-stride-none", lambda c: hpe.strided_perplexity(c.model, list(range(10)), window=4, stride=None),
         hp.InvalidParameterError, "stride is required", "llama"),
    Case("curve-bucket-0", lambda c: hpe.perplexity_curve(c.model, [list(range(10))], length=8, bucket=0),
         hp.InvalidParameterError, "bucket must be >= 1", "llama"),
    Case("curve-bucket-negative", lambda c: hpe.perplexity_curve(c.model, [list(range(10))], length=8, bucket=-1),
         hp.InvalidParameterError, "bucket must be >= 1", "llama"),
    Case("curve-length-0", lambda c: hpe.perplexity_curve(c.model, [list(range(10))], length=0),
         hp.InvalidParameterError, "length must be >= 2", "llama"),
    Case("curve-perplexity-not-a-curve", lambda c: hpe.curve_perplexity({}, 0), hp.InvalidInputError,
         "what perplexity_curve returns"),
    Case("trials-no-lengths", lambda c: hpe.make_trials("passkey", tiny_tokenizer(), lengths=[], depths=[0.5]),
         hp.InvalidParameterError, "at least one length and one depth"),
    Case("trials-depth-past-1", lambda c: hpe.make_trials("passkey", tiny_tokenizer(), lengths=[256], depths=[1.5]),
         hp.InvalidParameterError, "depths[0] must be <= 1"),
    Case("trials-depth-a-str", lambda c: hpe.make_trials("passkey", tiny_tokenizer(), lengths=[256], depths=["a"]),
         hp.ParameterTypeError, "depths[0] must be a number"),
    Case("trials-zero", lambda c: hpe.make_trials("passkey", tiny_tokenizer(), lengths=[256], depths=[0.5], trials=0),
         hp.InvalidParameterError, "trials must be >= 1"),
    Case("trials-no-tokenizer", lambda c: hpe.make_trials("passkey", None, lengths=[256], depths=[0.5]),
         hp.InvalidInputError, "tokenizer must be a transformers tokenizer"),
    Case("summarize-scores-missing", lambda c: hpe.summarize(
        hpe.make_trials("passkey", tiny_tokenizer(), lengths=[256], depths=[0.0, 1.0]), [{"correct": True, "logprob": 0.0}]),
         hp.InvalidInputError, "2 trials and 1 scores"),
    Case("variant-empty", lambda c: hpe.parse_variant(""), hp.InvalidParameterError, "a variant is 'none'"),
    Case("variant-none", lambda c: hpe.parse_variant(None), hp.InvalidParameterError, "a variant is 'none'"),
    Case("grid-empty", lambda c: hpe.expand_grid(""), hp.InvalidParameterError, "a grid is a method"),
]


def stacked(path: Path) -> Path:
    model = tiny("gpt2")
    hp.patch(model, "rope")
    hp.patch(model, "yarn", factor=2)
    model.save_pretrained(path / "stacked")
    return path / "stacked"


def broken_record(model):
    model.config.hf_posenc = "yarn"
    return model


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(case, tmp_path):
    ctx = SimpleNamespace(tmp=tmp_path, model=build(case.model), path=None, loaded=None)
    if case.setup is not None:
        ctx.path = case.setup(tmp_path)
    if case.setup is without_original_table:
        ctx.loaded = hp.from_pretrained(ctx.path)
    subject = ctx.loaded if ctx.loaded is not None else ctx.model
    if case.id == "describe-malformed-record":  # the record is broken first: what must not change is the rest
        broken_record(ctx.model)
    before, files = model_state(subject), files_state(tmp_path)
    with pytest.raises(case.error) as raised:
        case.call(ctx)
    assert case.match in str(raised.value), str(raised.value)
    assert_same_model(before, model_state(subject))
    assert files_state(tmp_path) == files
    if isinstance(subject, nn.Module) and case.id not in ("already-patched", "describe-malformed-record") \
            and ctx.loaded is None:
        assert not is_patched(subject)


def test_every_case_names_its_file_where_a_file_is_wrong(tmp_path):
    """Record and corpus errors say which file: the config.json path, the corpus file."""
    folder = edited_record(*YARN_RECORD, set_record("yarn"))(tmp_path)
    with pytest.raises(hp.CheckpointRecordError, match=str(folder / "config.json")):
        hp.from_pretrained(folder)
    bad = text_file("a.txt", b"\xff")(tmp_path)
    with pytest.raises(hp.InvalidInputError, match=str(bad)):
        load_corpus(str(bad))


# -- item 1: unpatch after hp.from_pretrained ------------------------------------------------------

def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def stock_reference(model, path: Path):
    """The model as stock transformers saves and loads it (what unpatch must give back, config included)."""
    model.save_pretrained(path)
    return type(model).from_pretrained(path).eval()


def comparable(config) -> dict:
    """The config as it decides the model: its path aside, and the keys transformers 4.x reads, which a load
    writes from rope_parameters (hf_posenc._compat.write_legacy_rope_keys) and a config built in memory lacks."""
    out = config.to_dict()
    out.pop("_name_or_path", None)
    legacy = _compat.legacy_rope_keys(config) or {}
    for key in _compat.LEGACY_ROPE_KEYS:
        if key in legacy and out.get(key) == legacy[key]:
            out.pop(key, None)
    return out


@pytest.mark.parametrize("kind, method, params", [
    ("gpt2", "alibi", {}), ("gpt2", "rope", {}), ("gpt2", "relative_bias", {"k": 8}),
    ("bert", "alibi", {}), ("bert", "rope", {"partial_rotary_factor": 0.5}), ("bert", "relative_bias", {"k": 4}),
    ("roberta", "alibi", {}), ("opt", "rope", {}),
    ("llama", "alibi", {}), ("llama", "xpos", {}), ("llama", "relative_bias", {"k": 8}), ("llama", "yarn", {"factor": 2}),
    ("llama", "dynamic_yarn", {"factor": 2}), ("llama", "longrope", {"factor": 2, "long_factor": [2.0] * 8}),
])
def test_unpatch_after_from_pretrained_gives_the_original_model_bit_for_bit(tmp_path, kind, method, params):
    model = build(kind)
    reference = stock_reference(model, tmp_path / "original")
    hp.patch(model, method, **params)
    model.save_pretrained(tmp_path / "patched")
    loaded = hp.from_pretrained(tmp_path / "patched")
    hp.unpatch(loaded)
    assert hp.describe(loaded)["method"] is None and not is_patched(loaded)
    assert comparable(loaded.config) == comparable(reference.config)
    expected, got = reference.state_dict(), loaded.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    # its next save is the original model, which stock transformers loads with the original's logits
    again = stock_reference(loaded, tmp_path / "again")
    ids = token_ids(16, vocab=97) + 3
    assert torch.equal(logits(again, ids), logits(reference, ids))


def test_unpatch_peels_a_stacked_checkpoint_back_to_the_learned_table(tmp_path):
    model = tiny("gpt2")
    original = model.transformer.wpe.weight.detach().clone()
    loaded = hp.from_pretrained(stacked(tmp_path))
    hp.unpatch(loaded)
    assert hp.describe(loaded)["method"] == "rope"
    hp.unpatch(loaded)
    assert isinstance(loaded.transformer.wpe, nn.Embedding) and torch.equal(loaded.transformer.wpe.weight, original)


def test_a_checkpoint_saved_without_the_original_table_still_loads_patched(tmp_path):
    folder = without_original_table(tmp_path)
    model = tiny("gpt2")
    hp.patch(model, "alibi")
    loaded = hp.from_pretrained(folder)
    ids = token_ids(40, vocab=97) + 3
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    with pytest.raises(hp.NotPatchedError, match="load the original checkpoint"):
        hp.unpatch(loaded)
    assert hp.describe(loaded)["method"] == "alibi"


def test_stock_transformers_still_refuses_an_attention_patched_table(tmp_path):
    """The original table travels beside the empty one, which still stops stock loading."""
    folder = saved(tmp_path, "gpt2", "relative_bias", k=4)
    assert load_file(folder / "model.safetensors")[f"transformer.wpe.{ORIGINAL_TABLE}"].shape == (32, 32)
    with pytest.raises((RuntimeError, ValueError)):
        AutoModelForCausalLM.from_pretrained(folder)


# -- item 8: numpy and torch values are saved as plain JSON ----------------------------------------

@pytest.mark.parametrize("method, params", [
    ("yarn", {"factor": torch.tensor(2.0)}),
    ("yarn", {"factor": np.float64(2.0), "beta_fast": np.int64(16), "truncate": np.bool_(False)}),
    ("linear", {"max_position_embeddings": np.int64(128)}),
    ("longrope", {"factor": 2, "long_factor": torch.full((8,), 2.0)}),
    ("longrope", {"factor": 2, "long_factor": np.full(8, 2.0), "short_factor": torch.ones(8, requires_grad=True)}),
    ("longrope", {"factor": 2, "long_factor": [np.float32(2.0)] * 8}),
    ("longrope", {"factor": 2, "long_factor": [torch.tensor(2.0)] * 8}),
])
def test_numpy_and_torch_parameters_save_and_reload(tmp_path, method, params):
    model = tiny_model()
    hp.patch(model, method, **params)
    record = model.config.hf_posenc["params"]
    assert all(type(v) in (int, float, bool, str, type(None), list, tuple) for v in record.values())
    model.save_pretrained(tmp_path)
    saved_record = json.loads((tmp_path / "config.json").read_text())["hf_posenc"]["params"]
    assert saved_record == json.loads(json.dumps(record))
    ids = token_ids(150)
    expected = logits(model, ids)
    assert torch.equal(logits(hp.from_pretrained(tmp_path), ids), expected)
    assert torch.equal(logits(AutoModelForCausalLM.from_pretrained(tmp_path).eval(), ids), expected)  # stock


def test_a_patch_whose_record_is_not_json_is_refused_before_anything_changes(tmp_path, monkeypatch):
    """The half-written config.json of issue 12 came from save_pretrained opening the file, then failing to
    serialise a tensor in the record. Parameters are plain now; the record is also checked when patching."""
    model = tiny_model()
    before = model_state(model)
    monkeypatch.setattr(hp.configs.YarnConfig, "to_dict", lambda self: {"factor": {2.0}})
    with pytest.raises(hp.ParameterTypeError, match="cannot be saved in config.json"):
        hp.patch(model, "yarn", factor=2)
    assert_same_model(before, model_state(model))
    assert not is_patched(model)


# -- item 7: a record written by this code loads ----------------------------------------------------

# Every method's record loads back through the strict read, with the same logits: tests/test_contracts.py.


# -- item 10: PEFT, training ------------------------------------------------------------------------

def test_patch_describe_unpatch_work_through_a_peft_wrapper():
    peft = pytest.importorskip("peft")
    reference = tiny("gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: fan_in_fan_out for GPT-2's Conv1D
        wrapped = peft.get_peft_model(tiny("gpt2"), peft.LoraConfig(r=2, target_modules=["c_attn"]))
    base = wrapped.get_base_model()
    assert hp.describe(wrapped)["mechanism"] == "learned"
    ids = token_ids(48, vocab=97) + 3  # past the 32-position table
    assert hp.patch(wrapped, "interpolate", factor=2) is wrapped
    assert hp.describe(wrapped)["method"] == "interpolate" and is_patched(base)
    with torch.no_grad():
        assert wrapped(ids).logits.shape == (1, 48, 100)
    expected = hp.patch(tiny("gpt2"), "interpolate", factor=2)
    with torch.no_grad():  # LoRA starts at zero: the wrapper is the patched model
        assert torch.allclose(wrapped(ids).logits, expected(ids).logits, atol=1e-6)
    hp.unpatch(wrapped)
    short = ids[:, :32]
    with torch.no_grad():
        assert torch.allclose(wrapped(short).logits, reference(short).logits, atol=1e-6)
    assert any("lora_" in name for name, _ in wrapped.named_parameters())


@pytest.mark.parametrize("method, params", [("interpolate", {"factor": 2}), ("tile", {"factor": 2}),
                                            ("sinusoidal", {"factor": 2, "trainable": True}),
                                            ("relative_bias", {"k": 4})])
def test_a_patch_in_the_middle_of_training_warns_about_the_optimizer(method, params):
    model = tiny("gpt2").train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(token_ids(8, vocab=97) + 3, labels=token_ids(8, vocab=97) + 3).loss.backward()
    optimizer.step()
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    with pytest.warns(UserWarning, match="not in any optimizer built before this call"):
        hp.patch(model, method, **params)
    new = [p for p in model.parameters() if id(p) not in held]
    assert new and all(p.requires_grad for p in new)  # what the warning is about: the optimizer lacks them


@pytest.mark.parametrize("kind, method, params, mode", [
    ("gpt2", "interpolate", {"factor": 2}, "eval"),  # loaded models are in eval mode: patch, then build the optimizer
    ("gpt2", "sinusoidal", {"factor": 2}, "train"),  # no new trainable parameter
    ("llama", "yarn", {"factor": 2}, "train"),
])
def test_no_warning_where_no_optimizer_can_miss_a_parameter(kind, method, params, mode):
    model = build(kind)
    getattr(model, mode)()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hp.patch(model, method, **params)

