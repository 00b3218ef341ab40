"""Mixed context windows (LongRoPE2, Shang et al. 2025): one fine-tune trains windows inside the original context
with the short rope (the model's own frequencies) and long windows with the target's, so that it adapts to the
long rope and keeps what it could do inside the original context.

What makes it work after training is a rope that switches with the input's length as it switched in training:
the run trains and saves a `longrope` patch, which transformers' rotary module turns to its short factors for an
input whose position ids stay inside the original context and to its long factors past it. A static RoPE
rescaling (linear, ntk, yarn, llama3, ...) becomes that patch with its own frequencies as the long factors (one
factor a rotary pair: the unpatched frequency over the rescaled one) and all-1 short factors; a `longrope` patch is
that already. Its attention factor (transformers applies one at every length) is the patch's `attention_factor`
when given, else 1: inside the original context the switched model is then the unpatched model exactly.

    params = switched_params(model, "yarn", {"max_position_embeddings": 32768})
    hp.patch(model, "longrope", **params)
    short = drawn_short(seed=42, index=7, share=0.5)   # micro-batch 7 of the run: short or long, from the seed
"""

from __future__ import annotations

import numpy as np
import torch

from .. import _compat, api
from ..config import RopeMethodConfig, check_number
from ..errors import MethodNotApplicableError
from ..registry import get_method


def why_no_short_rope(method: str) -> str | None:
    """Why `method` cannot train mixed windows (None: it can)."""
    cls = get_method(method)
    if not issubclass(cls, RopeMethodConfig):
        return (f"posenc method {method!r} is not a RoPE rescaling: it has no short rope to switch to (mixed "
                f"windows switch a model's rotary frequencies with the window's length)")
    if cls.length_dependent and cls.name != "longrope":
        return (f"posenc method {method!r} already follows the input's length (the unpatched frequencies inside "
                f"the original context): it has no fixed long rope to mix with; use data.short_share for short "
                f"sequences, or a static method (yarn, ntk, linear, llama3, longrope)")
    return None


def rotary_of(model: torch.nn.Module) -> torch.nn.Module:
    """The model's one rotary module (mixed windows switch one RoPE for every layer)."""
    return _compat.single_rotary(model, "mixed windows switch")


def switched_params(model: torch.nn.Module, method: str, params: dict) -> dict:
    """The `longrope` patch parameters of `method` with `params`, switched: the method's frequencies past the
    original context, the unpatched ones (or a longrope patch's own short factors) inside it. The model is left
    as it was (a skeleton on the meta device will do: only its config is read)."""
    why = why_no_short_rope(method)
    if why:
        raise MethodNotApplicableError(why)
    if method == "longrope":
        return dict(params)
    text = model.config.get_text_config()
    rotary = rotary_of(model)
    before, _ = _compat.rope_init(text, None, text.max_position_embeddings, type(rotary))
    with api.patched(model, method, **params) as patched:
        text = patched.config.get_text_config()
        target = int(text.max_position_embeddings)
        after, _ = _compat.rope_init(text, None, target, type(rotary_of(patched)))
    factors = (before.double() / after.double()).tolist()
    attention = params.get("attention_factor")
    return {"max_position_embeddings": target, "long_factor": [float(f) for f in factors],
            "short_factor": [1.0] * len(factors), "attention_factor": 1.0 if attention is None else float(attention)}


def drawn_short(*, seed: int, index: int, share: float) -> bool:
    """Whether micro-batch `index` of a run seeded `seed` trains inside the original context: a draw of its own
    (not the position schemes' stream), so a resumed run draws the same, and every process alike for the same
    micro-batch."""
    check_number("share", share, minimum=0, maximum=1, optional=False)
    check_number("seed", seed, minimum=0, integer=True, optional=False)
    check_number("index", index, minimum=0, integer=True, optional=False)
    if share <= 0:
        return False
    return bool(np.random.default_rng([seed, 0x6D697865, index]).random() < share)
