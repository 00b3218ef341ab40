"""llama.cpp against hf_posenc on the files hp.write_gguf_model writes: per-token log-prob differences, each method
beside the unpatched model's own floor and beside how far the patch moves the model (what a rope error would
show), in each weight format. Needs llama-cpp-python (scripts/build_engines.sh) and the embedded SmolLM2 GGUF
(its vocabulary).

    python benchmarks/bench_llama_cpp.py                  # the tiny wide Llama of tests/test_llama_cpp.py, 8x
    python benchmarks/bench_llama_cpp.py --tokens 500 --formats f32 f16 bf16 q8_0
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc import assets
from hf_posenc.gguf_writer import write_gguf_model

import common

CASES = [("none", {}), ("base", {"theta": 80000.0}), ("ntk", {"factor": 8}), ("linear", {"factor": 8}),
         ("yarn", {"factor": 8}), ("yarn", {"factor": 8, "attention_factor": 1.3}), ("llama3", {"factor": 8}),
         ("longrope", {"factor": 8, "long_factor": [1.0, 1.0, 1.0, 1.4, 2.2, 3.9, 7.5, 9.0], "attention_factor": 1.01}),
         ("longrope", {"factor": 8, "long_factor": [1, 1, 2, 3, 4, 6, 8, 8], "short_factor": [1, 1, 2, 3, 4, 6, 8, 8]})]


def model(method: str, params: dict):
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                                  tie_word_embeddings=False, initializer_range=0.3)
    m = AutoModelForCausalLM.from_config(config).eval()
    return hp.patch(m, method, **params) if method != "none" else m


def main() -> None:
    parser = common.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=500, choices=range(2, 4097), metavar="N")
    parser.add_argument("--formats", nargs="+", default=["f32", "f16"], choices=["f32", "f16", "bf16", "q8_0"])
    args = parser.parse_args()
    try:
        import llama_cpp
    except ImportError:
        common.refuse("llama-cpp-python is not installed: bash scripts/build_engines.sh")

    context = ((args.tokens + 255) // 256) * 256
    ids = (torch.arange(args.tokens) * 7919 % 49000 + 10).tolist()
    vocab = assets.smollm2_gguf()
    print(common.machine())
    print(f"llama-cpp-python {llama_cpp.__version__}; {args.tokens} tokens, n_ctx {context}, F32 KV cache")
    unpatched = None
    with tempfile.TemporaryDirectory() as folder:
        for fmt in args.formats:
            for method, params in CASES:
                m = model(method, params)
                path = Path(folder) / "m.gguf"
                write_gguf_model(m, path, vocab_from=vocab, dtype=fmt, overwrite=True)
                start = time.perf_counter()
                llm = llama_cpp.Llama(str(path), n_ctx=context, n_batch=context, n_ubatch=context, logits_all=True,
                                      verbose=False, type_k=0, type_v=0, n_threads=2)
                llm.eval(ids)
                theirs = torch.log_softmax(torch.tensor(np.array(llm.scores[:args.tokens]), dtype=torch.float64), -1)
                llm.close()
                with torch.no_grad():
                    ours = torch.log_softmax(m(torch.tensor([ids])).logits[0].double(), -1)
                if method == "none" and unpatched is None:
                    unpatched = ours
                delta = (theirs - ours).abs()
                moved = float((ours - unpatched).abs().mean())
                print(f"| {fmt} | {method} {params} | {float(delta.mean()):.2e} | {float(delta.max()):.2e} | "
                      f"{moved:.2f} | {time.perf_counter() - start:.1f} s |", flush=True)


if __name__ == "__main__":
    common.run(main)
