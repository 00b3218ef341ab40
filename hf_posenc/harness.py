"""Moved to hf_posenc/eval/harness.py: this name keeps `hf_posenc.harness` imports working (the same
module object, not a copy)."""

import sys

from .eval import harness as _moved

if __name__ == "__main__":   # `python -m hf_posenc.harness`, as documented before the move
    sys.exit(_moved.main())
sys.modules[__name__] = _moved
