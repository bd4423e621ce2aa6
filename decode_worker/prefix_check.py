"""What the decode worker checks of an arriving prefix before it queues it, beyond what the
decoder checks of every message: that its KV arrays are the engine's own (count, dtype, shape,
byte length of each frame), that its length fits a slot, and that its first token is in the
vocabulary. A prefix that passes can be inserted; one that does not would have raised from deep
in the engine (an array too few raised IndexError in the JAX engine's insert, which nothing
caught, and ended the worker)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from splitserve.engine.interface import Engine
from splitserve.protocol import PrefixHeader


def prefix_problem(header: PrefixHeader, frames: list[Any], engine: Engine) -> str | None:
    """Why this prefix cannot go into a slot of engine, or None."""
    if not 1 <= header.length <= engine.max_seq_len:
        return f"a prefix of {header.length} tokens; a slot holds 1 to {engine.max_seq_len}"
    if header.first_token >= engine.vocab_size:
        return f"first token {header.first_token} outside the vocabulary ({engine.vocab_size})"
    layout = engine.kv_layout(header.length)
    if len(header.kv_meta) != len(layout) or len(frames) != len(layout):
        return f"{len(header.kv_meta)} KV arrays, the engine takes {len(layout)}"
    for (dtype, shape), (want_dtype, want_shape), frame in zip(
        header.kv_meta, layout, frames, strict=True
    ):
        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError, SyntaxError):  # what numpy raises on a dtype string
            return f"KV dtype {dtype!r} is no dtype"
        if dt != want_dtype or tuple(shape) != tuple(want_shape):
            return f"KV array {dtype} {shape}, the engine takes {want_dtype.str} {list(want_shape)}"
        if _nbytes(frame) != dt.itemsize * math.prod(want_shape):
            return f"a KV frame of {_nbytes(frame)} bytes for {dtype} {shape}"
    return None


def _nbytes(frame: Any) -> int:
    buffer = frame.buffer if hasattr(frame, "buffer") else frame
    return memoryview(buffer).nbytes
