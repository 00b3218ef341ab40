"""llama.cpp against hf_posenc on the files hp.write_gguf_model writes: per-token log-prob differences, each method
beside the unpatched model's own floor and beside how far the patch moves the model (what a rope error would
show), in each weight format. Needs llama-cpp-python (scripts/build_engines.sh) and the embedded SmolLM2 GGUF
(its vocabulary).

    python benchmarks/bench_llama_cpp.py                  # the tiny wide Llama of tests/test_llama_cpp.py, 8x
    python benchmarks/bench_llama_cpp.py --tokens 500 --formats f32 f16 bf16 q8_0
    python benchmarks/bench_llama_cpp.py --model smollm2 --tokens 12288 --formats f32   # SmolLM2 on the KJV, x4
    python benchmarks/bench_llama_cpp.py --model smollm2 --tokens 12288 --formats f32 --methods none \
        --folders banded_ft150=outputs/smollm2_search_32k_banded_cpu

With `--model smollm2`: SmolLM2-135M (float32 weights of the embedded file) patched to 32768 with YaRN, NTK and the
static searched longrope set (recipes/configs/smollm2_search_32k_cpu_finetune.yaml's), linear, llama3 and base
(theta x4; `--methods` picks among them), and saved folders (`--folders NAME=FOLDER`), on the first --tokens tokens
of the King James Bible; the differences inside the original 8192 tokens and past them are given apart (a rope
error grows with the position), and past them also on each next token's log-prob (what perplexity reads: a rope
error shifts it on every far token, where the vocabulary-wide maximum can be one rare entry).
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
from hf_posenc.export.gguf_writer import write_gguf_model

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


def smollm2_cases() -> list[tuple[str, dict]]:
    import yaml

    from hf_posenc.recipes import config_path

    searched = yaml.safe_load(config_path("smollm2_search_32k_cpu_finetune").read_text())["posenc"]
    target = {"max_position_embeddings": 32768}
    return [("none", {}), ("yarn", target), ("ntk", target), ("linear", target), ("llama3", target),
            ("base", {"theta": 400000.0}), ("longrope", {k: v for k, v in searched.items() if k != "method"})]


def smollm2(method: str, params: dict):
    m = hp.load_model("smollm2", dtype=torch.float32).eval()
    return hp.patch(m, method, **params) if method != "none" else m


def log_prob_deltas(ours_logits: torch.Tensor, theirs_scores, original: int | None, ids: list[int], rows: int = 1024):
    """|log-prob differences| over the whole vocabulary (mean; max inside the original context; max past it) and
    on each next token past it (mean, max: what perplexity reads, where a rope error would shift every far token),
    `rows` tokens at a time (12k tokens x 49152 in float64 would be 5 GB)."""
    total, count, inside, past, nexts = 0.0, 0, 0.0, 0.0, []
    following = torch.tensor(ids[1:] + [0])
    for start in range(0, ours_logits.shape[0], rows):
        ours = torch.log_softmax(ours_logits[start:start + rows].double(), -1)
        theirs = torch.log_softmax(torch.tensor(np.asarray(theirs_scores[start:start + rows]), dtype=torch.float64), -1)
        delta = (theirs - ours).abs().max(-1).values
        total += float((theirs - ours).abs().sum())
        count += ours.numel()
        positions = torch.arange(start, start + ours.shape[0])
        cut = positions < (original or 10**9)
        inside = max(inside, float(delta[cut].max()) if cut.any() else 0.0)
        past = max(past, float(delta[~cut].max()) if (~cut).any() else 0.0)
        far = ~cut & (positions < len(ids) - 1)   # the last token has no next one
        nexts.append((theirs - ours).gather(1, following[positions][:, None])[:, 0][far].abs())
    nexts = torch.cat(nexts)
    far_mean, far_max = (float(nexts.mean()), float(nexts.max())) if len(nexts) else (0.0, 0.0)
    return total / count, inside, past, far_mean, far_max


def main() -> None:
    parser = common.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=500, choices=range(2, 16385), metavar="N")
    parser.add_argument("--formats", nargs="+", default=["f32", "f16"], choices=["f32", "f16", "bf16", "q8_0"])
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    parser.add_argument("--methods", nargs="+", metavar="METHOD",
                        help="with --model smollm2: the methods to run (default all: none yarn ntk linear llama3 base "
                             "longrope)")
    parser.add_argument("--folders", nargs="+", metavar="NAME=FOLDER", default=[],
                        help="with --model smollm2: saved SmolLM2 folders (a search's best, a fine-tune's output) run "
                             "as hf-posenc export writes them (their own tokenizer), after the methods")
    args = parser.parse_args()
    if args.model == "tiny" and args.tokens > 4096:
        common.refuse(f"--tokens {args.tokens}: the tiny model's runs take at most 4096 (--model smollm2 for more)")
    if (args.methods or args.folders) and args.model != "smollm2":
        common.refuse("--methods and --folders are --model smollm2's; the tiny model runs all of its own cases")
    folders = {}
    for spec in args.folders:
        name, _, folder = spec.partition("=")
        if not name or not folder or not Path(folder, "config.json").is_file():
            common.refuse(f"--folders {spec}: give NAME=FOLDER, a saved folder with its config.json")
        folders[name] = folder
    args.folders = folders
    try:   # both models run in llama.cpp: refused before anything loads
        import llama_cpp
    except ImportError:
        common.refuse("llama-cpp-python is not installed: bash scripts/build_engines.sh")
    if args.model == "smollm2":
        known = [method for method, _ in smollm2_cases()]
        unknown = [m for m in args.methods or [] if m not in known]
        if unknown:
            common.refuse(f"--methods {' '.join(unknown)}: not among {' '.join(known)}")
        return main_smollm2(args)

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
                                      verbose=False, type_k=0, type_v=0, n_threads=torch.get_num_threads())
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


def main_smollm2(args) -> None:
    import llama_cpp

    context = ((args.tokens + 255) // 256) * 256
    tokenizer = hp.load_tokenizer("smollm2")
    ids = common.corpus_ids(tokenizer, "kjv")[:args.tokens]
    vocab = assets.smollm2_gguf()
    print(common.machine())
    print(f"llama-cpp-python {llama_cpp.__version__}; SmolLM2-135M, {args.tokens} KJV tokens, n_ctx {context}, "
          f"F32 KV cache; | format | method | mean abs diff | max inside 8192 | max past 8192 | "
          f"next token past 8192: mean / max | seconds |")
    cases = [(method, params, None) for method, params in smollm2_cases()
             if not args.methods or method in args.methods]
    cases += [(name, {}, folder) for name, folder in args.folders.items()]
    with tempfile.TemporaryDirectory() as folder:
        for fmt in args.formats:
            for method, params, saved in cases:
                start = time.perf_counter()
                path = Path(folder) / "m.gguf"
                if saved is None:
                    m = smollm2(method, params)
                    write_gguf_model(m, path, vocab_from=vocab, dtype=fmt, overwrite=True)
                else:   # as hf-posenc export writes a folder: its patch as loaded, its own tokenizer
                    m = hp.load_model(saved, dtype=torch.float32).eval()
                    write_gguf_model(m, path, tokenizer=hp.load_tokenizer(saved), dtype=fmt, overwrite=True)
                llm = llama_cpp.Llama(str(path), n_ctx=context, n_batch=512, n_ubatch=512, logits_all=True,
                                      verbose=False, type_k=0, type_v=0, n_threads=torch.get_num_threads())
                llm.eval(ids)
                theirs = llm.scores[:args.tokens]
                with torch.no_grad():
                    ours = m(torch.tensor([ids])).logits[0]
                mean, inside, past, next_mean, next_max = log_prob_deltas(ours, theirs, 8192, ids)
                llm.close()
                shown = {k: (f"[{len(v)} values]" if isinstance(v, list) else v) for k, v in params.items()}
                print(f"| {fmt} | {method} {shown} | {mean:.2e} | {inside:.2e} | {past:.2e} | "
                      f"{next_mean:.2e} / {next_max:.2e} | {time.perf_counter() - start:.0f} |", flush=True)
                del ours, theirs, m


if __name__ == "__main__":
    common.run(main)
