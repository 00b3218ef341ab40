"""Moved to hf_posenc/train/mixed_windows.py: this name keeps `hf_posenc.mixed_windows` imports working (the same
module object, not a copy)."""

import sys

from .train import mixed_windows as _moved

sys.modules[__name__] = _moved
