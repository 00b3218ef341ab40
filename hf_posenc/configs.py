"""Every method's config class by its class name, for `hp.configs.YarnConfig(factor=4)`: the registered
methods (one module each in hf_posenc/methods/) and the kinds they derive from (hf_posenc/config.py,
hf_posenc/attention.py)."""

from .attention import AttentionMethodConfig  # noqa: F401
from .config import LearnedMethodConfig, MethodConfig, RopeMethodConfig  # noqa: F401
from .registry import METHODS

globals().update({cls.__name__: cls for cls in METHODS.values()})

__all__ = sorted(["MethodConfig", "RopeMethodConfig", "LearnedMethodConfig", "AttentionMethodConfig",
                  *(cls.__name__ for cls in METHODS.values())])
