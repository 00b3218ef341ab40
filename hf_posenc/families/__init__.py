"""Family adapters: each knows where one architecture family keeps its positions (rope_models.py: every model
whose rotary module is built from its config; learned_tables.py: the generic learned-table adapter, with one
file per family's TableSpec). Importing the package imports every module in it, and each registers its family
(`register_family`, hf_posenc/family.py), so a new family's file needs nothing else."""

import importlib
import pkgutil

# rope_models first: the first family that matches a model is its family, and a learned-table model swapped to
# rotary positions (the `rope` method) is a RoPE model from then on, rescaled by the RoPE adapter
for _module in sorted((info.name for info in pkgutil.iter_modules(__path__)), key=lambda name: name != "rope_models"):
    importlib.import_module(f"{__name__}.{_module}")
