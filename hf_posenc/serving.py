"""Moved to hf_posenc/export/serving.py: this name keeps `hf_posenc.serving` imports working (the same
module object, not a copy)."""

import sys

from .export import serving as _moved

sys.modules[__name__] = _moved
