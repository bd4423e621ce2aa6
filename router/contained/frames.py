"""Frames between the router and a contained child: a 4-byte big-endian length, then one
MessagePack map. No pickle: a child runs native code on a client's input, so what it sends back
must be plain data, checked for size before it is read."""

from __future__ import annotations

import asyncio
import struct
from typing import Any, BinaryIO

import msgpack

HEADER = struct.Struct(">I")
# a job carries at most a whole request body's messages; an answer at most a rendered prompt
# (splitserve/tokenizers/chat_template.py bounds it) in UTF-8
MAX_FRAME_BYTES = 96 << 20


class FrameError(ValueError):
    """A frame that is too large or not a MessagePack map."""


def pack(obj: dict[str, Any]) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {len(body)} bytes (at most {MAX_FRAME_BYTES})")
    return HEADER.pack(len(body)) + body


def unpack(body: bytes) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types on garbage
        raise FrameError(f"not MessagePack: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError("a frame must be a map")
    return obj


def _length(head: bytes) -> int:
    (n,) = HEADER.unpack(head)
    if n > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {n} bytes (at most {MAX_FRAME_BYTES})")
    return n


def read(fh: BinaryIO) -> dict[str, Any]:
    """The next frame (EOFError when the other side has closed)."""
    head = _read_exactly(fh, HEADER.size)
    return unpack(_read_exactly(fh, _length(head)))


def write(fh: BinaryIO, obj: dict[str, Any]) -> None:
    fh.write(pack(obj))
    fh.flush()


async def read_async(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The next frame (asyncio.IncompleteReadError when the child has gone)."""
    head = await reader.readexactly(HEADER.size)
    return unpack(await reader.readexactly(_length(head)))


def _read_exactly(fh: BinaryIO, n: int) -> bytes:
    chunks = []
    while n:
        chunk = fh.read(n)
        if not chunk:
            raise EOFError("the router closed the pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
