"""Messages to ZeroMQ frames and back: frame 0 is a type code and a MessagePack array of the
fields, KV arrays travel as extra frames without copies. decode() raises ProtocolError on anything
malformed."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import msgpack
import numpy as np

from splitserve.protocol.field_specs import (
    FIELD_SPECS,
    MESSAGE_CHECKS,
)
from splitserve.protocol.messages import (
    _NESTED,
    MESSAGE_TYPES,
    TYPE_CODES,
    PrefixHeader,
    ProtocolError,
)
from splitserve.protocol.wire_checks import (
    Bool,
    Choice,
    Float,
    Int,
    Items,
    Str,
    WireError,
    compile_check,
)

# ---- the codec -----------------------------------------------------------------------------------


class _Codec:
    """One dataclass's wire plan, built once: which fields hold nested messages, and the check of
    each arriving value. Plain fields (numbers, strings, lists of them) go to MessagePack as they
    are, which packs them in C: walking a prompt element by element in Python cost more
    than the rest of the message together."""

    def __init__(self, cls: type):
        self.cls = cls
        self.fields = dataclasses.fields(cls)
        self.names = [f.name for f in self.fields]
        self.required = sum(
            1
            for f in self.fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        self.checks: list[Any] = []  # compiled by link(), once every codec exists
        self.post = MESSAGE_CHECKS.get(cls)
        # (field index, the nested message class, "one" | "many" (a list) | "optional")
        self.nested: list[tuple[int, type, str]] = []
        hints = typing.get_type_hints(cls)
        self.hints = [hints[name] for name in self.names]
        for i, hint in enumerate(self.hints):
            if hint in _NESTED:
                self.nested.append((i, hint, "one"))
            elif typing.get_origin(hint) is list and typing.get_args(hint)[0] in _NESTED:
                self.nested.append((i, typing.get_args(hint)[0], "many"))
            elif _optional_of(hint) in _NESTED:
                self.nested.append((i, _optional_of(hint), "optional"))

    def link(self) -> None:
        specs = FIELD_SPECS.get(self.cls, {})
        unknown = set(specs) - set(self.names)
        assert not unknown, f"FIELD_SPECS names no field of {self.cls.__name__}: {unknown}"
        self.checks = [
            _check_for(hint, specs.get(name), f"{self.cls.__name__}.{name}")
            for name, hint in zip(self.names, self.hints, strict=True)
        ]

    def to_wire(self, obj: Any) -> list[Any]:
        values = [getattr(obj, name) for name in self.names]
        for i, cls, kind in self.nested:
            codec = _CODECS[cls]
            if kind == "many":
                values[i] = [codec.to_wire(x) for x in values[i]]
            elif values[i] is not None:
                values[i] = codec.to_wire(values[i])
        return values

    def from_wire(self, values: Any) -> Any:
        cls = self.cls
        if type(values) is not list:
            raise WireError(f"{cls.__name__}: expected an array, got {type(values).__name__}")
        if not self.required <= len(values) <= len(self.names):
            raise WireError(f"{cls.__name__}: {len(values)} fields, expected {len(self.names)}")
        msg = cls(*[check(v) for check, v in zip(self.checks, values, strict=False)])
        if self.post is not None:
            self.post(msg)
        return msg


def _optional_of(hint: Any) -> Any:
    """X for a hint `X | None`, else None."""
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def _check_for(hint: Any, spec: Any, where: str):
    """The check of one field's wire value: its spec (FIELD_SPECS) or its type's default."""
    inner = _optional_of(hint)
    if inner is not None:
        check_inner = _check_for(inner, spec, where)
        return lambda v: None if v is None else check_inner(v)
    if hint in _NESTED:
        assert spec is None, f"{where}: a nested message is checked by its own specs"
        return _CODECS[hint].from_wire
    if spec is None:
        spec = _default_spec(hint, where)
    elif typing.get_origin(hint) is list and isinstance(spec, Items) and spec.item is None:
        spec = dataclasses.replace(spec, item=_default_spec(typing.get_args(hint)[0], where))
    return compile_check(spec, where)


def _default_spec(hint: Any, where: str) -> Any:
    if hint is bool:
        return Bool()
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        return Choice(frozenset(hint), hint)
    if hint is int:
        return Int()
    if hint is float:
        return Float()
    if hint is str:
        return Str()
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if item in _NESTED:
            return Items(_CODECS[item].from_wire)
        return Items(_default_spec(item, where))
    # a field whose type has no check would let anything through: refuse it at import
    raise TypeError(f"{where}: no wire check for the type {hint!r}; give it a FIELD_SPECS entry")


_CODECS: dict[type, _Codec] = {cls: _Codec(cls) for cls in (*_NESTED, *MESSAGE_TYPES.values())}
for _codec in _CODECS.values():
    _codec.link()


def encode(msg: Any, arrays: list[np.ndarray] | None = None) -> list[Any]:
    """Message -> frames. Arrays become extra frames (memoryviews: no copy on send)."""
    cls = type(msg)
    body = msgpack.packb(_CODECS[cls].to_wire(msg), use_bin_type=True)
    frames: list[Any] = [bytes([TYPE_CODES[cls]]) + body]
    for a in arrays or ():
        frames.append(memoryview(np.ascontiguousarray(a)).cast("B"))
    return frames


def decode(frames: list[Any]) -> tuple[Any, list[Any]]:
    """Frames -> (message, extra frames). Raises ProtocolError on anything malformed: a message
    that decodes has every field of its type and within its range (FIELD_SPECS, MESSAGE_CHECKS),
    and extra frames only when it is a PrefixHeader, one per array it announces."""
    if not frames:
        raise ProtocolError("empty message")
    head = bytes(frames[0])
    if not head:
        raise ProtocolError("empty header frame")
    cls = MESSAGE_TYPES.get(head[0])
    if cls is None:
        raise ProtocolError(f"unknown message type {head[0]}")
    try:
        body = msgpack.unpackb(head[1:], raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable {cls.__name__} body: {exc}") from exc
    try:
        msg = _CODECS[cls].from_wire(body)
    except (TypeError, ValueError) as exc:  # WireError, and a wrong value a constructor refused
        raise ProtocolError(f"malformed {cls.__name__}: {exc}") from exc
    extra = list(frames[1:])
    announced = len(msg.kv_meta) if cls is PrefixHeader else 0
    if len(extra) != announced:
        raise ProtocolError(f"{cls.__name__} with {len(extra)} extra frames, {announced} announced")
    return msg, extra


def kv_meta(arrays: list[np.ndarray]) -> list[list[Any]]:
    return [[a.dtype.str, list(a.shape)] for a in arrays]


def arrays_from_frames(meta: list[list[Any]], frames: list[Any]) -> list[np.ndarray]:
    """Rebuild KV arrays as read-only views over the received frames (no copy)."""
    if len(meta) != len(frames):
        raise ProtocolError(f"{len(frames)} array frames, header announces {len(meta)}")
    arrays = []
    for (dtype, shape), frame in zip(meta, frames, strict=True):
        try:
            dt = np.dtype(dtype)
            if dt.kind not in "fiub":  # numbers only: never objects from the wire
                raise ProtocolError(f"array dtype {dtype} is not numeric")
            a = np.frombuffer(frame.buffer if hasattr(frame, "buffer") else frame, dt)
            arrays.append(a.reshape(shape))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad array frame {dtype} {shape}: {exc}") from exc
    return arrays
