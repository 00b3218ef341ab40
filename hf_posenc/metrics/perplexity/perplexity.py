"""Perplexity of a causal LM on texts, as the hub's "perplexity" metric computes it, with three
additions: any model hf_posenc loads (hub id, folder, .gguf, "smollm2") or an already loaded one,
a positional patch applied for the measurement (`variant`, `max_position_embeddings`), and an
optional sliding window (`stride`) for texts longer than `max_length`."""

import datasets
import evaluate
import torch

import hf_posenc
from hf_posenc import eval as hpe
from hf_posenc.eval import document_perplexity, strided_perplexity

_DESCRIPTION = """Perplexity (exp of the mean negative log-likelihood per token) of each text under a causal LM.
Texts longer than `max_length` tokens are truncated, or, with `stride`, scored with a sliding window."""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the texts to score.
    model_id (str): a hub id, a folder, a .gguf file, or "smollm2" (the embedded SmolLM2-135M). Or:
    model (PreTrainedModel) and tokenizer: an already loaded model (it is patched and unpatched in place).
    variant (str): "none" (default) or a method with parameters, e.g. "yarn" or "yarn beta_fast=16".
    max_position_embeddings (int): the patch's target context (default: twice the model's).
    max_length (int): tokens per text or per window (default: the patched context, or the model's own).
    stride (int): score texts longer than max_length with windows every `stride` tokens (default: truncate).
    add_start_token (bool): prepend the tokenizer's BOS token to each text (default False).
    dtype (str): the dtype to load model_id in ("bfloat16", "float32"; default: the checkpoint's).
Returns:
    perplexities (list of float), mean_perplexity (their mean), perplexity (over all tokens), tokens.
Examples:
    >>> ppl = hf_posenc.metrics.load("perplexity")
    >>> ppl.compute(predictions=["To be, or not to be"], model_id="smollm2", variant="yarn")
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Perplexity(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string")}),
        )

    def _compute(self, predictions, model_id=None, model=None, tokenizer=None, variant="none",
                 max_position_embeddings=None, max_length=None, stride=None, add_start_token=False, dtype=None):
        if (model_id is None) == (model is None):
            raise ValueError("give either model_id= (a name or path) or model= with tokenizer=")
        if model is None:
            kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
            model = hf_posenc.load_model(model_id, **kwargs).eval()
            tokenizer = hf_posenc.load_tokenizer(model_id)
        elif tokenizer is None:
            raise ValueError("model= needs tokenizer= too")
        context = model.config.get_text_config().max_position_embeddings
        target = max_position_embeddings or 2 * context
        start = [tokenizer.bos_token_id] if add_start_token and tokenizer.bos_token_id is not None else []
        if add_start_token and not start:
            raise ValueError("add_start_token=True, but the tokenizer has no BOS token")
        docs = [start + ids for ids in tokenizer(list(predictions), add_special_tokens=False)["input_ids"]]
        with hpe.variant(model, variant, target) as params:
            length = max_length or params.get("max_position_embeddings") or context
            if stride:
                scores = [strided_perplexity(model, d, window=length, stride=stride, progress=False) for d in docs]
            else:
                scores = [document_perplexity(model, [d], max_length=length, progress=False) for d in docs]
        tokens = sum(s["tokens"] for s in scores)
        return {
            "perplexities": [s["perplexity"] for s in scores],
            "mean_perplexity": sum(s["perplexity"] for s in scores) / len(scores),
            "perplexity": float(torch.tensor(sum(s["nll"] * s["tokens"] for s in scores) / tokens).exp()),
            "tokens": tokens,
        }
