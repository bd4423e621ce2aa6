"""A GGUF file's header: its key/value metadata and its tensor table, read without llama.cpp.

The one GGUF reader of the project: the weight loader (engine/model/weights_gguf.py) takes the
tensor table and the metadata scalars, the tokenizer (tokenizers/gguf_tokenizer.py) the metadata
with its arrays (vocabulary, scores, merges). A reader of our own rather than gguf.GGUFReader: that
one parses every entry of the embedded vocabulary into numpy views, which costs seconds per
worker start; here arrays a caller does not want are skipped, not parsed.

Layout (little-endian): "GGUF", version (1 to 3), tensor count, key/value count, the key/value
pairs, the tensor infos, then the tensor data from the next multiple of general.alignment.
Version 1 counts and lengths are 32-bit; later versions' are 64-bit.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

# GGUF value types -> struct format of a scalar (little-endian); numpy reads the same codes
_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order, outermost first (GGUF lists dims innermost first)
    ggml_type: int  # a gguf.GGMLQuantizationType value
    offset: int  # bytes from the start of the tensor data


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]  # arrays are None unless read with arrays=True
    tensors: tuple[TensorInfo, ...]
    data_start: int  # byte offset of the tensor data in the file


class _Cursor:
    """Reads header fields from a buffer (a memory map: pages are read only when touched)."""

    def __init__(self, buf: memoryview, wide: bool = True) -> None:
        self.buf, self.at, self.wide = buf, 0, wide

    def take(self, n: int) -> memoryview:
        if self.at + n > len(self.buf):
            raise GGUFFormatError("truncated GGUF header")
        self.at += n
        return self.buf[self.at - n : self.at]

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.buf):
            raise GGUFFormatError("truncated GGUF header")
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += size
        return value

    def count(self) -> int:
        return self.scalar("<Q" if self.wide else "<I")

    def string(self) -> str:
        return bytes(self.take(self.count())).decode("utf-8", errors="replace")

    def value(self, vtype: int, arrays: bool) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise GGUFFormatError(f"unknown GGUF value type {vtype}")
        etype, n = self.scalar("<I"), self.count()
        if etype in _SCALARS:
            dtype = np.dtype(_SCALARS[etype])
            raw = self.take(n * dtype.itemsize)
            return np.frombuffer(raw, dtype).tolist() if arrays else None
        if etype == _STRING and not arrays:
            for _ in range(n):
                self.take(self.count())
            return None
        items = [self.value(etype, arrays) for _ in range(n)]
        return items if arrays else None


def read_header(buf: np.ndarray, arrays: bool = True) -> GGUFHeader:
    """The header of a GGUF file held in `buf` (uint8, e.g. a memory map of the file)."""
    cur = _Cursor(memoryview(buf).cast("B"))
    if bytes(cur.take(4)) != b"GGUF":
        raise GGUFFormatError("not a GGUF file")
    version = cur.scalar("<I")
    if version not in (1, 2, 3):
        raise GGUFFormatError(f"unsupported GGUF version {version} (big-endian file?)")
    cur.wide = version >= 2
    n_tensors, n_kv = cur.count(), cur.count()
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"), arrays)
    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.count() for _ in range(cur.scalar("<I"))]
        tensors.append(TensorInfo(name, tuple(reversed(dims)), cur.scalar("<I"),
                                  cur.scalar("<Q")))  # fmt: skip
    align = int(metadata.get("general.alignment") or 32)
    return GGUFHeader(version, metadata, tuple(tensors), -(-cur.at // align) * align)


def open_gguf(path: str, arrays: bool = True) -> tuple[np.ndarray, GGUFHeader]:
    """The whole file as a read-only uint8 memory map, and its header."""
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        return buf, read_header(buf, arrays)
    except GGUFFormatError as exc:
        raise GGUFFormatError(f"{path}: {exc}") from None


def read_metadata(path: str) -> dict[str, Any]:
    """All key/value metadata of a GGUF file, arrays included."""
    return open_gguf(path)[1].metadata

