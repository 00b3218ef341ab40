"""BOS framing: every document, window and prompt starts as the model's tokenizer starts an input (Llama,
Gemma, Mistral: their BOS; GPT-2, SmolLM2: nothing), in hf_posenc.corpora, hf_posenc.eval, recipes/evaluate.py
and the fine-tune data, checked on a tiny tokenizer that adds a BOS and one that does not, against
perplexities computed here from separate forwards."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import datasets
import pytest
import torch
import yaml

from hf_posenc import corpora
from hf_posenc import eval as hpe
from hf_posenc.train import data as train_data
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import finetune_recipe
from hf_posenc.recipes import finetune_checks as checks
from hf_posenc.recipes import finetune_config as FC
from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("eval_recipe_framing", ROOT / "hf_posenc" / "recipes" / "evaluate.py")
recipe = sys.modules["eval_recipe_framing"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)

EOS, BOS = 256, 257
TEXT = "".join(f"Act {i}: the {['ghost', 'prince', 'queen'][i % 3]} walks at {i * 5 % 11} o'clock.\n" for i in range(40))


def byte_tokenizer(adds_bos: bool):
    """tests/tiny.py's byte-level tokenizer with <eos> = 256 and <bos> = 257; with `adds_bos`, its
    post-processor puts <bos> before every input, as Llama's, Gemma's and Mistral's tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<eos>": EOS, "<bos>": BOS})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")


def plain_ids(text: str) -> list[int]:
    return byte_tokenizer(False)(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def prefix_nll(model, ids: list[int]) -> list[float]:
    """NLL of ids[t] for t >= 1, each from its own forward over ids[:t] (no one-pass shortcut)."""
    out = []
    for t in range(1, len(ids)):
        logits = model(torch.tensor([ids[:t]])).logits[0, -1].float()
        out.append(-torch.log_softmax(logits, -1)[ids[t]].item())
    return out


@pytest.fixture(scope="module")
def model():
    return tiny_model(vocab_size=TINY_TEXT_VOCAB)


# -- hf_posenc.corpora ------------------------------------------------------------------------------------

def test_bos_prefix_follows_the_tokenizer_and_can_be_forced():
    with_bos, without = byte_tokenizer(True), byte_tokenizer(False)
    assert with_bos("ab")["input_ids"] == [BOS, 64, 65] and without("ab")["input_ids"] == [64, 65]
    assert corpora.bos_prefix(with_bos) == [BOS] and corpora.bos_prefix(without) == []
    assert corpora.bos_prefix(without, True) == [BOS] and corpora.bos_prefix(with_bos, False) == []
    with pytest.raises(ValueError, match="bos=True, but the tokenizer has no BOS token"):
        corpora.bos_prefix(tiny_tokenizer(), True)
    with pytest.raises(ValueError, match="bos must be 'auto', True or False, got 'yes'"):
        corpora.bos_prefix(with_bos, "yes")


def test_tokenize_frames_each_document_as_the_tokenizer_frames_an_input():
    corpus = datasets.Dataset.from_dict({"text": [TEXT, "xy"]})
    framed = corpora.tokenize(corpus, byte_tokenizer(True))
    assert framed["input_ids"][:] == [byte_tokenizer(True)(t)["input_ids"] for t in (TEXT, "xy")]
    assert framed["input_ids"][1] == [BOS, *plain_ids("xy")] and framed["num_tokens"][1] == 3
    assert corpora.tokenize(corpus, byte_tokenizer(True), bos=False)["input_ids"][1] == plain_ids("xy")
    assert corpora.tokenize(corpus, byte_tokenizer(False))["input_ids"][1] == plain_ids("xy")


# -- hf_posenc.eval ------------------------------------------------------------------------------------

def test_perplexity_with_bos_scores_the_document_after_the_bos(model):
    doc = plain_ids(TEXT)[:40]
    framed = corpora.tokenize(datasets.Dataset.from_dict({"text": [TEXT]}), byte_tokenizer(True))["input_ids"][0][:41]
    assert framed == [BOS, *doc]
    nll = hpe.token_nll(model, torch.tensor(framed))[0]
    assert len(nll) == len(doc)  # every token of the document is a target, the BOS never is
    reference = prefix_nll(model, framed)
    assert nll.tolist() == pytest.approx(reference, abs=1e-4)
    expected = math.exp(sum(reference) / len(reference))
    assert hpe.document_perplexity(model, [framed], max_length=41, progress=False)["perplexity"] == pytest.approx(expected, rel=1e-5)
    by_length = hpe.perplexity_by_length(model, [framed], [11, 41], progress=False)["perplexity"]
    assert by_length == pytest.approx([math.exp(sum(reference[:10]) / 10), expected], rel=1e-5)
    # and it is not the perplexity without the BOS (the document's first token unscored, no BOS to attend to)
    without = hpe.document_perplexity(model, [doc], max_length=40, progress=False)["perplexity"]
    assert without == pytest.approx(math.exp(sum(prefix_nll(model, doc)) / 39), rel=1e-5) and without != pytest.approx(expected)


@pytest.mark.parametrize("stride", [9, 4])
def test_strided_perplexity_puts_the_bos_before_every_window(model, stride):
    text = plain_ids(TEXT)[:30]
    out = hpe.strided_perplexity(model, text, window=10, stride=stride, bos=BOS, progress=False)
    assert out["tokens"] == 30  # every token of the text once, the first one too (after the BOS)
    if stride == 9:  # plain chunks of 9: each scored from its own [BOS] + chunk
        nll = [n for begin in range(0, 30, 9) for n in prefix_nll(model, [BOS, *text[begin:begin + 9]])]
        assert out["nll"] == pytest.approx(sum(nll) / 30, rel=1e-5)
    with pytest.raises(ValueError, match=r"stride must be in 1\.\.window - 1 \(9: the BOS takes a position\), got 10"):
        hpe.strided_perplexity(model, text, window=10, stride=10, bos=BOS)
    assert hpe.strided_perplexity(model, text, window=10, stride=stride, progress=False)["tokens"] == 29


def test_retrieval_prompts_start_with_the_bos_when_the_tokenizer_adds_one():
    for tokenizer, first in ((byte_tokenizer(True), [BOS]), (byte_tokenizer(False), [])):
        trials = hpe.make_trials("passkey", tokenizer, lengths=[400], depths=[0.5])
        assert trials[0].prompt[:len(first) + 1] == first + plain_ids("There")[:1]
        assert len(trials[0].prompt) + len(trials[0].answer) <= 400
        assert BOS not in trials[0].prompt[len(first):]


# -- recipes/evaluate.py ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus")
    (path / "a.txt").write_text(TEXT)
    return path


def checkpoint(folder: Path, adds_bos: bool) -> Path:
    tiny_model(vocab_size=TINY_TEXT_VOCAB).save_pretrained(folder)
    byte_tokenizer(adds_bos).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("adds_bos,framing,expected", [(True, "auto", "bos"), (True, "none", "none"),
                                                        (False, "auto", "none"), (False, "bos", "bos")])
def test_eval_recipe_scores_as_the_tokenizer_frames_and_says_so(tmp_path, corpus_dir, adds_bos, framing, expected):
    model_dir = checkpoint(tmp_path / "model", adds_bos)
    results = recipe.main(["--model.name", str(model_dir), "--model.dtype", "float32", "--data.corpus", str(corpus_dir),
                           "--output_dir", str(tmp_path / "out"), "--eval.variants", "none", "--data.framing", framing,
                           "--eval.max_position_embeddings", "128", "--eval.perplexity_lengths", "32", "64",
                           "--eval.perplexity_documents", "1", "--eval.strided_windows", "16",
                           "--eval.strided_tokens", "40"])
    assert results["framing"] == expected
    assert json.loads((tmp_path / "out" / "results.json").read_text())["framing"] == expected
    assert f"Framing: {expected} (" in (tmp_path / "out" / "summary.md").read_text()
    doc = ([BOS] if expected == "bos" else []) + plain_ids(TEXT)
    reference = prefix_nll(tiny_model(vocab_size=TINY_TEXT_VOCAB), doc[:64])
    assert results["variants"]["none"]["lengths"]["perplexity"] == pytest.approx(
        [math.exp(sum(reference[:31]) / 31), math.exp(sum(reference) / 63)], rel=1e-4)
    assert results["variants"]["none"]["strided"]["16"]["tokens"] == (40 if expected == "bos" else 39)


# -- fine-tuning data -------------------------------------------------------------------------------------

@pytest.mark.parametrize("adds_bos,framing,starts", [(True, "auto", [BOS]), (False, "auto", []), (True, "none", []),
                                                     (False, "bos", [BOS])])
def test_finetune_data_follows_the_tokenizer_by_default(tmp_path, corpus_dir, adds_bos, framing, starts):
    preflight = checks.Preflight(original_context=64, target_context=64, seq_len=64, short_len=None, causal=True)
    args = FC.FinetuneDataArgs(corpus=str(corpus_dir), framing=framing, cache_dir=str(tmp_path / "cache"))
    packed = train_data.prepare_data(args, byte_tokenizer(adds_bos), preflight)
    stream = [t for block in packed["input_ids"] for t in block]
    assert stream == starts + plain_ids(TEXT) + [EOS]  # every token once, the BOS first when there is one


def test_finetune_framing_is_checked_and_the_shipped_configs_follow_the_tokenizer():
    with pytest.raises(ConfigError, match="data.framing must be one of auto, bos, none, got 'maybe'"):
        FC.FinetuneDataArgs(framing="maybe")
    assert FC.FinetuneDataArgs().framing == "auto"
    for path in sorted((ROOT / "recipes" / "configs").glob("*finetune.yaml")):
        data = yaml.safe_load(path.read_text()).get("data") or {}
        assert "framing" not in data and "bos" not in data, path.name


def test_finetune_evaluation_scores_documents_after_the_bos(corpus_dir):
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB)
    cfg = FC.FinetuneConfig(model=FC.FinetuneModelArgs(), data=FC.FinetuneDataArgs(corpus=str(corpus_dir)), train=FC.TrainArgs(),
                   eval=FC.FinetuneEvalArgs(lengths=[32], documents=1))
    preflight = checks.Preflight(original_context=64, target_context=64, seq_len=64, short_len=None, causal=True)
    reference = prefix_nll(model, [BOS, *plain_ids(TEXT)[:31]])
    assert finetune_recipe.evaluate(model, byte_tokenizer(True), cfg, preflight)["perplexity@32"] == pytest.approx(
        math.exp(sum(reference) / 31), rel=1e-5)
