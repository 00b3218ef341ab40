"""docs/ARCHITECTURE.md's worked examples (new methods, a position scheme, a training loss, a RULER task family),
the files it shows: tests/conftest.py imports this package, so they are registered in the test process only, and
every check that runs the registered methods, schemes, losses or families (the contract suites, test_rope,
test_serving, test_positions, ...) runs them too; an installed hf_posenc never lists them. Each module here
registers itself on import, as a module of the package does."""

import importlib
import pkgutil

from hf_posenc import _compat
from hf_posenc.config import METHODS
from hf_posenc.eval.ruler import TASKS
from hf_posenc.train.losses import LOSSES
from hf_posenc.methods.rope import CUSTOM_ROPE_TYPE_PREFIX

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

# the methods registered from here (not from hf_posenc): name -> class
EXAMPLES = {name: cls for name, cls in METHODS.items() if cls.__module__.startswith(f"{__name__}.")}
# the training losses registered from here
LOSS_EXAMPLES = {name: cls for name, cls in LOSSES.items() if cls.__module__.startswith(f"{__name__}.")}
# the RULER task families registered from here
TASK_EXAMPLES = {name: cls for name, cls in TASKS.items() if cls.__module__.startswith(f"{__name__}.")}
# what hf_posenc.registry does for the methods of the package, which it imports before these
_compat.register_custom_rope_types(CUSTOM_ROPE_TYPE_PREFIX + name for name in EXAMPLES)
