"""Moved to hf_posenc/train/search.py: this name keeps `hf_posenc.search` imports working (the same
module object, not a copy)."""

import sys

from .train import search as _moved

sys.modules[__name__] = _moved
