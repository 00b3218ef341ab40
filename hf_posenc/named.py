"""The one table every registry of hf_posenc is: the methods (`METHODS`), the model families (`FAMILIES`), the
position schemes (`SCHEMES`), the training losses (`LOSSES`) and RULER's task families (`TASKS`).

A `Registry` maps a name to what registers under it (a class, or a family's instance), in the order they came; its
`register` is the decorator each table's `register_*` is: the entry must be of the table's base (a dataclass where
the table asks one), its name a word of the table's pattern, and a name already taken is refused naming both
entries, so two never shadow each other. Every refusal is a `RegistrationError`. Nothing here knows any table:
each module that owns one makes it (`METHODS = Registry("method", MethodConfig, ...)`).

Lookups answer too: `get(name)` (and `table[name]`) refuses an unknown name itself, one `UnknownNameError` (the
table's own subclass, where it has one) listing the known names and suggesting the closest; `parse("NAME k=v ...")`
is the one parser of a spec's text: the name looked up, the parameters as `parse_params` reads them (text that is
no spec at all: a `ParameterTypeError`)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from typing import Any

from .errors import InvalidParameterError, ParameterTypeError, RegistrationError, UnknownNameError

_MISSING = object()


def parse_params(pairs: list[str]) -> dict:
    """["beta_fast=16", "long_factor=[1,2]"] -> {"beta_fast": 16, "long_factor": [1, 2]}: values are JSON
    when they parse (numbers, lists, true/false/null), else strings. For command lines and configs."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidParameterError(f"parameters are key=value, got {pair!r}")
        if key in params:   # the last one would win without a word
            raise InvalidParameterError(f"parameter {key!r} is given twice ({key}={json.dumps(params[key])} and "
                                        f"{pair}): give it once")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


class Registry(dict):
    """name -> entry. `kind` names the table in messages ("method", "training loss"), `base` what an entry is (a
    subclass of it; an instance of it where `instances`), `setting` where users write the name (for messages)."""

    def __init__(self, kind: str, base: type, *, setting: str, decorator: str, instances: bool = False,
                 dataclass: bool = False, pattern: str = r"[a-z][a-z0-9_]*", error: type = UnknownNameError):
        super().__init__()
        self.kind, self.base, self.setting, self.decorator = kind, base, setting, decorator
        self.instances, self.dataclass, self.pattern, self.error = instances, dataclass, pattern, error

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self)})"

    def get(self, name: Any, default: Any = _MISSING) -> Any:
        """The entry registered as `name`; an unknown name refused (`unknown`), unless a default is given (then as
        dict.get)."""
        if default is not _MISSING:
            return super().get(name, default)
        if isinstance(name, str) and dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        raise self.unknown(name)

    def __getitem__(self, name: Any) -> Any:
        return self.get(name)   # never a bare KeyError

    def unknown(self, name: Any) -> UnknownNameError:
        """The refusal of a name the table does not hold: the known names, and the closest to it."""
        close = difflib.get_close_matches(name, list(self), n=1) if isinstance(name, str) else []
        what = f"unknown {self.kind} {name!r}" if isinstance(name, str) else \
            f"a {self.kind} is named by a str, got {name!r:.60} ({type(name).__name__})"
        return self.error(f"{what}; known: {', '.join(self)}" + (f" (did you mean {close[0]!r}?)" if close else ""))

    def parse(self, text: Any) -> tuple[str, dict]:
        """"NAME k=v ..." -> (NAME, {k: v}): the name looked up (an unknown one refused), the parameters read by
        `parse_params` (JSON values where they parse, else text)."""
        if not isinstance(text, str) or not text.split():
            raise ParameterTypeError(f"a {self.kind} is a name with key=value parameters ({self.setting}); known: "
                                     f"{', '.join(self)}; got {text!r:.60}")
        name, *pairs = text.split()
        self.get(name)
        try:
            return name, parse_params(pairs)
        except InvalidParameterError as err:
            raise InvalidParameterError(f"{self.kind} {text!r}: {err}") from None

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
        taken = self.get(name, None)
        if taken is not None and taken is not entry:
            raise RegistrationError(f"{self.kind} {name!r} is registered twice: {_label(taken)} and {_label(entry)}; "
                                    f"choose another name")
        self[name] = entry
        return entry


def _label(entry: Any) -> str:
    cls = entry if isinstance(entry, type) else type(entry)
    return f"{cls.__module__}.{cls.__qualname__}" + ("" if isinstance(entry, type) else f" ({entry.name!r})")
