"""Moved to hf_posenc/train/losses.py: this name keeps `hf_posenc.losses` imports working (the same
module object, not a copy)."""

import sys

from .train import losses as _moved

sys.modules[__name__] = _moved
