"""The one table every registry of hf_posenc is: the methods (`METHODS`), the model families (`FAMILIES`), the
position schemes (`SCHEMES`), the training losses (`LOSSES`) and RULER's task families (`TASKS`).

A `Registry` maps a name to what registers under it (a class, or a family's instance), in the order they came; its
`register` is the decorator each table's `register_*` is: the entry must be of the table's base (a dataclass where
the table asks one), its name a word of the table's pattern, and a name already taken is refused naming both
entries, so two never shadow each other. Every refusal is a `RegistrationError`. Nothing here knows any table:
each module that owns one makes it (`METHODS = Registry("method", MethodConfig, ...)`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .errors import RegistrationError


class Registry(dict):
    """name -> entry. `kind` names the table in messages ("method", "training loss"), `base` what an entry is (a
    subclass of it; an instance of it where `instances`), `setting` where users write the name (for messages)."""

    def __init__(self, kind: str, base: type, *, setting: str, decorator: str, instances: bool = False,
                 dataclass: bool = False, pattern: str = r"[a-z][a-z0-9_]*"):
        super().__init__()
        self.kind, self.base, self.setting, self.decorator = kind, base, setting, decorator
        self.instances, self.dataclass, self.pattern = instances, dataclass, pattern

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self)})"

    def register(self, entry: Any) -> Any:
        """Put `entry` in the table under its `name` and return it (a class decorator for tables of classes)."""
        if self.instances:
            ok, shape = isinstance(entry, self.base), f"a {self.base.__module__}.{self.base.__qualname__} instance"
        else:
            ok = isinstance(entry, type) and issubclass(entry, self.base) and entry is not self.base and (
                not self.dataclass or dataclasses.is_dataclass(entry))
            shape = (f"a @dataclass(frozen=True) subclass of {self.base.__name__}" if self.dataclass
                     else f"a {self.base.__name__} subclass")
        if not ok:
            raise RegistrationError(f"{self.decorator} takes {shape}, got {entry!r:.80}")
        # a class's own name: one inherited from the class it extends would take that class's place
        name = vars(entry).get("name") if isinstance(entry, type) else getattr(entry, "name", None)
        if not isinstance(name, str) or not re.fullmatch(self.pattern, name):
            raise RegistrationError(f"{_label(entry)} needs its own name, a lowercase word (the {self.kind}'s name in "
                                    f"{self.setting}), got {name!r}")
        taken = self.get(name)
        if taken is not None and taken is not entry:
            raise RegistrationError(f"{self.kind} {name!r} is registered twice: {_label(taken)} and {_label(entry)}; "
                                    f"choose another name")
        self[name] = entry
        return entry


def _label(entry: Any) -> str:
    cls = entry if isinstance(entry, type) else type(entry)
    return f"{cls.__module__}.{cls.__qualname__}" + ("" if isinstance(entry, type) else f" ({entry.name!r})")
