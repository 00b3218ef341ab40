"""Moved to hf_posenc/train/positions.py: this name keeps `hf_posenc.positions` imports working (the same
module object, not a copy)."""

import sys

from .train import positions as _moved

sys.modules[__name__] = _moved
