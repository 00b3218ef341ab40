"""Which tokens does LongCE weight? On windows of the training text, the weights w_t = min(P(long) / P(short),
clip) that `train.loss: longce` gives each token (hf_posenc/train/losses.py), and how many of the most weighted tokens
are copies: a token (or the 2 / 4 tokens ending at it) last seen before its short context began, so only the
long context holds it.

The model is the start of a fine-tune (default: SmolLM2-135M patched with YaRN to 32768, as
recipes/configs/smollm2_pose_32k_cpu_finetune.yaml starts) or a fine-tuned folder (--model). The windows are
the first --windows windows of --seq-len tokens of each play, contiguous ids, as `train.positions: contiguous`
sees them. A few 2k forwards: a minute on a CPU core.

    python benchmarks/bench_longce_weights.py                                  # the CPU config's settings
    python benchmarks/bench_longce_weights.py --model runs/ft/longce --window 1024
"""

from __future__ import annotations

import argparse
from pathlib import Path

import common
import torch

import hf_posenc as hp
from hf_posenc import eval as hpe
from hf_posenc.causal_lm import short_context_losses
from hf_posenc.train.losses import longce_weights

GRAMS = (1, 2, 4)


def copies(seq: list[int], first: int, window: int, stride: int) -> dict[int, list[bool]]:
    """{g: for each token t >= first, whether the g tokens ending at t occurred before t's short context began
    ((t - window) // stride * stride, as LongCE cuts it) and not inside it}."""
    out = {}
    for g in GRAMS:
        last, flags = {}, []
        for t in range(g - 1, len(seq)):
            gram = tuple(seq[t - g + 1:t + 1])
            if t >= first:
                begins = (t - window) // stride * stride
                flags.append(gram in last and last[gram] < begins)
            last[gram] = t
        out[g] = flags
    return out


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a fine-tuned folder (default: SmolLM2 patched with YaRN to 32768)")
    parser.add_argument("--plays", nargs="+", default=["macbeth", "othello", "lear", "tempest"])
    parser.add_argument("--windows", type=common.count(1), default=4, help="windows of each play (default 4)")
    parser.add_argument("--seq-len", type=common.count(2), default=2048)
    parser.add_argument("--window", type=common.count(1), default=512, help="LongCE's short window (default 512)")
    parser.add_argument("--stride", type=common.count(1), help="LongCE's stride (default: the window)")
    parser.add_argument("--clip", type=float, default=5.0)
    parser.add_argument("--dtype", default=None, choices=common.DTYPES,
                        help="default: bfloat16 where the hardware runs it natively")
    args = parser.parse_args()
    stride = args.stride or args.window
    if min(args.windows, args.seq_len, args.window, stride) < 1 or args.clip < 1:
        common.refuse("--windows, --seq-len, --window and --stride are >= 1, --clip >= 1")
    if args.window + stride >= args.seq_len:
        common.refuse(f"--window + --stride ({args.window + stride}) must be below --seq-len ({args.seq_len}): "
                      f"otherwise no token gets a shorter context")
    if args.model and not (Path(args.model) / "config.json").is_file():
        common.refuse(f"--model {args.model}: not a saved model folder (no config.json in it)")
    dtype = common.dtype_name(args.dtype)
    docs = common.plays(hp.load_tokenizer("smollm2"), args.plays, args.windows * args.seq_len)   # or refused
    if args.model:
        model = hp.from_pretrained(args.model, dtype=getattr(torch, dtype), attn_implementation="sdpa").eval()
    else:
        model = common.smollm2(dtype)[0]
        hp.patch(model, "yarn", max_position_embeddings=32768)
    print(f"{common.machine()}; {args.model or 'SmolLM2-135M + yarn 32768'} {dtype}; {len(docs)} plays x "
          f"{args.windows} windows of {args.seq_len}, short window {args.window}, stride {stride}, clip {args.clip}",
          flush=True)

    first = args.window + stride        # the tokens before keep weight 1
    weights, flags = [], {g: [] for g in GRAMS}
    for ids in docs.values():
        for k in range(args.windows):
            seq = ids[k * args.seq_len:(k + 1) * args.seq_len]
            x = torch.tensor([seq])
            with torch.no_grad():
                long = hpe.token_nll(model, x)[0].float()                          # entry t - 1 scores token t
                short = short_context_losses(model, x, torch.ones_like(x), args.window, stride)[0].float()
            weights.append(longce_weights(long, short, args.clip)[first - 1:])
            for g, f in copies(seq, first, args.window, stride).items():
                flags[g] += f
    w = torch.cat(weights)
    copy = {g: torch.tensor(f) for g, f in flags.items()}
    groups = [("every weighted token", torch.ones_like(w, dtype=torch.bool)), ("w >= 2", w >= 2),
              (f"w = {args.clip:g} (clipped)", w >= args.clip * (1 - 1e-6))]
    print(f"\n{len(w)} tokens with a short context (tokens {first}-{args.seq_len - 1} of each window); "
          f"mean weight {w.mean():.3f}")
    print("| tokens | n | share of tokens | share of the weight | " +
          " | ".join(f"{g}-gram copy" for g in GRAMS) + " |")
    print("|---" * (4 + len(GRAMS)) + "|")
    for name, keep in groups:
        shares = " | ".join(f"{copy[g][keep].float().mean():.1%}" if keep.any() else "-" for g in GRAMS)
        print(f"| {name} | {int(keep.sum())} | {keep.float().mean():.1%} | {w[keep].sum() / w.sum():.1%} | {shares} |")


if __name__ == "__main__":
    common.run(main)
