"""Moved to hf_posenc/train/s2_attention.py: this name keeps `hf_posenc.s2_attention` imports working (the same
module object, not a copy)."""

import sys

from .train import s2_attention as _moved

sys.modules[__name__] = _moved
