"""Moved to hf_posenc/train/data.py: this name keeps `hf_posenc.train_data` imports working (the same
module object, not a copy)."""

import sys

from .train import data as _moved

sys.modules[__name__] = _moved
