"""The methods, one module each (yarn.py, dca.py, hierarchical.py, ...): a dataclass of the method's parameters
and what it does to a model, through the interface of its kind (hf_posenc/config.py), registered where it is
defined (`@register_method`). Beside them, the mechanisms the methods build (rope.py, learned.py, sinusoidal.py,
bias.py, xpos.py, remapped.py, exact_cache.py): the math first, then the nn.Modules. docs/ARCHITECTURE.md has the
map.

Importing the package imports every module in it, so a new method's module is registered with nothing else to
edit (hf_posenc.registry imports the package)."""

import importlib
import pkgutil

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
