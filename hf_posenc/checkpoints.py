"""Moved to hf_posenc/train/checkpoints.py: this name keeps `hf_posenc.checkpoints` imports working (the same
module object, not a copy)."""

import sys

from .train import checkpoints as _moved

sys.modules[__name__] = _moved
