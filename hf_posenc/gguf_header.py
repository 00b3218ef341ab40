"""A GGUF file's metadata and tensor names, read from its header alone.

`gguf.GGUFReader` maps the whole file and builds a numpy view of every element of every metadata array
(SmolLM2's tokenizer holds ~100k strings: seconds); a config needs none of those strings. This reader walks
the header once (GGUF v2 / v3, either byte order: the key-value pairs, then the tensor table) and keeps
the scalars, the numeric arrays, and only the count of each string array.

`reader(path)` presents the result with the attributes transformers' GGUF config reader uses of a
`gguf.GGUFReader` (`fields[key].parts / .data / .types`, `tensors[i].name`), so `load_config` builds the
same config from it, without the strings (tests/test_gguf_header.py compares the two on the embedded
SmolLM2 file and on written files).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

STRING, ARRAY = 8, 9
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class GGUFHeaderError(ValueError):
    """Not a GGUF file this reader can walk (bad magic, version 1, truncated)."""


@dataclass
class StringArray:
    """A metadata array of strings, by its length only."""
    count: int


@dataclass
class Header:
    values: dict[str, object]  # key -> int / float / bool / str / numpy array / StringArray
    types: dict[str, list[int]]  # key -> GGUF value type ([ARRAY, element type] for arrays)
    tensor_names: tuple[str, ...] = field(default=())


def read(path: str | os.PathLike) -> Header:
    """The metadata and tensor names of the GGUF file at `path`, reading only its header."""
    with open(path, "rb") as handle:
        try:
            blob = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GGUFHeaderError(f"{path}: empty file, not GGUF") from None
    with blob:
        try:
            return _Walker(blob, path).header()
        except struct.error:
            raise GGUFHeaderError(f"{path}: the GGUF header ends early (a truncated file)") from None


class _Walker:
    def __init__(self, blob: mmap.mmap, path):
        self.blob, self.path, self.pos = blob, path, 0
        if blob[:4] != b"GGUF":
            raise GGUFHeaderError(f"{path}: not a GGUF file (it starts with {bytes(blob[:4])!r})")
        self.order = "<"
        version = struct.unpack_from("<I", blob, 4)[0]
        if version & 0xFFFF == 0:  # written big-endian
            self.order, version = ">", struct.unpack_from(">I", blob, 4)[0]
        if version not in (2, 3):
            raise GGUFHeaderError(f"{path}: GGUF version {version}; this reader walks versions 2 and 3")
        self.pos = 8

    def take(self, code: str):
        value = struct.unpack_from(self.order + code, self.blob, self.pos)[0]
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        size = self.take("Q")
        if self.pos + size > len(self.blob):
            raise struct.error("string past the end")
        self.pos += size
        return bytes(self.blob[self.pos - size:self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        raise GGUFHeaderError(f"{self.path}: unknown GGUF value type {kind} at byte {self.pos}")

    def array(self) -> tuple[object, int]:
        kind, count = self.take("I"), self.take("Q")
        if kind == STRING:
            for _ in range(count):  # skip each string: only the count is kept
                size = self.take("Q")
                self.pos += size
            if self.pos > len(self.blob):
                raise struct.error("array past the end")
            return StringArray(count), kind
        if kind not in _SCALARS:
            raise GGUFHeaderError(f"{self.path}: an array of GGUF type {kind}, which this reader does not walk")
        dtype = np.dtype(_SCALARS[kind]).newbyteorder(self.order)
        values = np.frombuffer(self.blob, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += values.nbytes
        return values, kind

    def header(self) -> Header:
        tensors, pairs = self.take("Q"), self.take("Q")
        values, types = {}, {}
        for _ in range(pairs):
            key, kind = self.string(), self.take("I")
            if kind == ARRAY:
                values[key], element = self.array()
                types[key] = [ARRAY, element]
            else:
                values[key], types[key] = self.value(kind), [kind]
        names = []
        for _ in range(tensors):  # name, dimensions, type, offset
            names.append(self.string())
            dimensions = self.take("I")
            self.pos += 8 * dimensions + 4 + 8
        return Header(values, types, tuple(names))


class _Elements:
    """`parts` of an array field as transformers reads them: one numpy array per element. Strings are
    given empty, so only the count survives (a config needs no token text)."""

    def __init__(self, values):
        self.values = values

    def __getitem__(self, index):
        if isinstance(self.values, StringArray):
            return np.zeros(0, dtype=np.uint8)
        return self.values[index:index + 1]


def _field(value, kind: list[int]) -> SimpleNamespace:
    if kind[0] == ARRAY:
        count = value.count if isinstance(value, StringArray) else len(value)
        return SimpleNamespace(types=kind, parts=_Elements(value), data=range(count))
    part = np.frombuffer(value.encode(), dtype=np.uint8) if kind[0] == STRING else np.array([value])
    return SimpleNamespace(types=kind, parts=[part], data=[0])


def reader(path: str | os.PathLike) -> SimpleNamespace:
    """The header of `path` with the attributes of a `gguf.GGUFReader` that a config is read from."""
    header = read(path)
    return SimpleNamespace(fields={k: _field(v, header.types[k]) for k, v in header.values.items()},
                           tensors=[SimpleNamespace(name=n) for n in header.tensor_names])


@contextlib.contextmanager
def config_only():
    """While inside, `gguf.GGUFReader` (which transformers' GGUF config reader constructs) reads only
    the header. Files this reader cannot walk go to gguf's own reader."""
    import gguf

    full = gguf.GGUFReader

    def header_reader(path, *args, **kwargs):
        try:
            return reader(path)
        except GGUFHeaderError:
            return full(path, *args, **kwargs)

    gguf.GGUFReader = header_reader
    try:
        yield
    finally:
        gguf.GGUFReader = full
