"""How far back a fine-tune's training windows reach: for a fine-tune config (and any of its overrides), the share
of scored tokens whose own context reaches back into each distance bin: a token's position id under
train.positions, which with data.packing=documents counts from its document's first token in the window. A token
whose context reaches 24k back is one that trains attention across 24k; the rest train nearer distances only.

The windows are the recipe's own (`FinetuneRecipe.setup_data` and `window_batch`): window k gets the ids a run
draws for window k; the texts are read in the plain data loader's order, not the run's seeded shuffle (the same
texts over an epoch, so the same shares). No model is loaded; nothing is written but a temporary output folder.

    python benchmarks/bench_window_reach.py --config smollm2_search_32k_banded_cpu_finetune
    python benchmarks/bench_window_reach.py --config smollm2_search_32k_banded_cpu_finetune --train.positions 'cream text=span'
"""

from __future__ import annotations

import tempfile

import numpy as np
import torch

import common
from hf_posenc.recipes.finetune_config import parse_config
from hf_posenc.recipes.finetune_recipe import FinetuneRecipe, window_batch


def epochs(loader):
    """The loader's windows, epoch after epoch (a run of more steps than windows reads them again)."""
    while True:
        yield from loader


def tokens(low: int, high: int) -> str:
    """A bin's label: 4-8k, or 8-16 for bins that are not whole thousands of 1024."""
    return f"{low // 1024}-{high // 1024}k" if low % 1024 == high % 1024 == 0 else f"{low}-{high}"


def reach(recipe_args: list[str]) -> tuple[np.ndarray, object]:
    """How far back each scored token of a fine-tune's windows reaches (its position id), over its train.steps
    steps, and the run's config: `recipe_args` as `hf-posenc finetune` takes them."""
    with tempfile.TemporaryDirectory() as out:
        cfg = parse_config([*recipe_args, "--output_dir", f"{out}/run"])
        recipe = FinetuneRecipe(cfg)
        recipe.setup_accelerator()
        recipe.setup_data()
        windows, reached = epochs(recipe.dataloader), []
        for step in range(1, cfg.train.steps + 1):
            for micro in range(cfg.train.grad_accum):
                batch = window_batch(recipe.preflight, next(windows), cfg, recipe.accelerator, step, micro)
                ids = batch.get("position_ids")
                if ids is None:   # contiguous: the model's own 0..n-1 (its documents' ids when kept apart)
                    ids = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
                reached.append(ids[batch["attention_mask"].bool()])
    return torch.cat(reached).numpy(), cfg


def main() -> None:
    parser = common.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", type=common.count(1), default=4096, help="the width of a distance bin in tokens")
    args, recipe_args = parser.parse_known_args()
    reached, cfg = reach(recipe_args)
    edges = np.arange(0, max(int(reached.max()) + 1, args.bin) + args.bin, args.bin)
    counts, _ = np.histogram(reached, edges)
    print(f"{cfg.train.positions or 'contiguous'}, packing {cfg.data.packing}, {cfg.data.seq_len}-token windows, "
          f"{cfg.train.steps} steps: {len(reached):,} scored tokens; the share whose context reaches back into each bin")
    print("| bin (tokens back) | share |\n|---|---|")
    for low, high, n in zip(edges[:-1], edges[1:], counts):
        print(f"| {tokens(low, high)} | {n / len(reached):.3f} |")
    for far in (16384, 24576):
        if far < edges[-1]:
            print(f"reaching >= {far // 1024}k: {(reached >= far).mean():.3f}")
    print(common.machine())


if __name__ == "__main__":
    common.run(main)
