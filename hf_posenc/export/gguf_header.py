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
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

STRING, ARRAY = 8, 9
MAX_NESTING = 16  # arrays of arrays this deep are corruption, not metadata
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class GGUFHeaderError(ValueError):
    """Not a GGUF file this reader can walk (bad magic, version 1, truncated, a count past its end)."""


@dataclass
class StringArray:
    """A metadata array of strings (or of arrays), by its length only."""
    count: int


@dataclass
class Header:
    values: dict[str, object]  # key -> int / float / bool / str / numpy array / StringArray (strings, arrays)
    types: dict[str, list[int]]  # key -> GGUF value type ([ARRAY, element type, ...] for arrays, as gguf gives)
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
        except UnicodeDecodeError as err:
            raise GGUFHeaderError(f"{path}: a GGUF key that is not UTF-8 ({err.reason})") from None


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

    def room(self, count: int, size: int, what: str) -> None:
        """Refuse `count` items of at least `size` bytes each that the rest of the file cannot hold
        (a corrupt count would otherwise loop, or ask numpy for petabytes)."""
        if count * size > len(self.blob) - self.pos:
            raise GGUFHeaderError(f"{self.path}: {count} {what} at byte {self.pos} do not fit in the "
                                  f"{len(self.blob)}-byte file (a corrupt or truncated header)")

    def take(self, code: str):
        value = struct.unpack_from(self.order + code, self.blob, self.pos)[0]
        self.pos += struct.calcsize(code)
        return value

    def string(self, what: str = "string bytes", errors: str = "replace") -> str:
        size = self.take("Q")
        self.room(size, 1, what)
        self.pos += size
        return bytes(self.blob[self.pos - size:self.pos]).decode("utf-8", errors=errors)

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        raise GGUFHeaderError(f"{self.path}: unknown GGUF value type {kind} at byte {self.pos}")

    def array(self, depth: int = 1) -> tuple[object, list[int]]:
        """(the array, its element types: [type], or [ARRAY, ...] down the first element as gguf lists them)."""
        if depth > MAX_NESTING:  # a corrupt file could nest past Python's recursion limit
            raise GGUFHeaderError(f"{self.path}: arrays nested more than {MAX_NESTING} deep at byte {self.pos}")
        kind, count = self.take("I"), self.take("Q")
        if kind in (STRING, ARRAY):  # skip each element: only the count is kept
            self.room(count, 8 if kind == STRING else 12, "array elements")
            types = [kind]
            for index in range(count):
                if kind == STRING:
                    size = self.take("Q")
                    self.pos += size
                    if self.pos > len(self.blob):
                        raise struct.error("array past the end")
                else:
                    inner = self.array(depth + 1)[1]
                    if index == 0:
                        types += inner
            return StringArray(count), types
        if kind not in _SCALARS:
            raise GGUFHeaderError(f"{self.path}: an array of GGUF type {kind}, which this reader does not walk")
        dtype = np.dtype(_SCALARS[kind]).newbyteorder(self.order)
        self.room(count, dtype.itemsize, "array elements")
        values = np.frombuffer(self.blob, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += values.nbytes
        return values, [kind]

    def header(self) -> Header:
        tensors, pairs = self.take("Q"), self.take("Q")
        self.room(pairs, 12, "key-value pairs")  # key length + value type, at the least
        values, types = {}, {}
        for _ in range(pairs):
            key, kind = self.string("key bytes", errors="strict"), self.take("I")
            if key in values:
                raise GGUFHeaderError(f"{self.path}: the GGUF key {key!r} appears twice")
            if kind == ARRAY:
                values[key], element = self.array()
                types[key] = [ARRAY, *element]
            else:
                values[key], types[key] = self.value(kind), [kind]
        self.room(tensors, 24, "tensor entries")  # name length, dimensions, type, offset
        names = []
        for _ in range(tensors):
            names.append(self.string())
            dimensions = self.take("I")
            self.pos += 8 * dimensions + 4 + 8
            if self.pos > len(self.blob):
                raise struct.error("tensor table past the end")
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


class _HeaderReader:
    """Stands in for `gguf.GGUFReader` inside `config_only`: the header reader for the thread that
    entered (its refusal names the file and the fault; gguf's own reader would fail on the same files
    less clearly, or hang on a corrupt array count), gguf's own reader for every other thread."""

    def __init__(self, full, thread: int):
        self.full, self.thread = full, thread

    def __call__(self, path, *args, **kwargs):
        if threading.get_ident() == self.thread:
            return reader(path)
        return self.full(path, *args, **kwargs)


_swap = threading.Lock()


@contextlib.contextmanager
def config_only():
    """While inside, `gguf.GGUFReader` (which transformers' GGUF config reader constructs from the module
    at each call) reads only the header, in this thread. Without the gguf package nothing is swapped:
    transformers says how to install it."""
    try:
        import gguf
    except ImportError:
        yield
        return
    current = gguf.GGUFReader
    if isinstance(current, _HeaderReader) and current.thread == threading.get_ident():
        yield  # nested: the outer window restores the real reader
        return
    with _swap:  # one window at a time, so each restores the reader it replaced
        full = gguf.GGUFReader
        gguf.GGUFReader = _HeaderReader(full, threading.get_ident())
        try:
            yield
        finally:
            gguf.GGUFReader = full
