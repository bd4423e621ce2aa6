"""Fuzzing the decoder: for every message type, wire bodies whose fields have random types and
values (well-formed messages broken at random places, and bodies made up from nothing) either
decode into a well-typed message or raise ProtocolError, never anything else.

"Well-typed" is checked here independently of the codec's own specs, from the type hints and from
what the handlers rely on: an int is an int (not a bool) within int64, a float is finite (a
log-probability may be -inf), token ids and indices are non-negative int32, parallel columns have
one length, a heartbeat carries its own role's load and no other."""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
import types
import typing

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitserve import protocol
from splitserve.protocol import MESSAGE_TYPES, TYPE_CODES, ProtocolError
from tests.wire_strategies import BY_TYPE, messages

INT64 = (-(2**63), 2**63 - 1)
INT32_FIELDS = {  # engines index int32 arrays with these, so they are non-negative int32
    "detok_index", "prompt", "top_k", "max_tokens", "min_tokens", "eos_ids", "stop_token_ids",
    "length", "first_token", "seqs", "tokens", "token_ids", "index", "pid", "context",
    "bias_ids", "bad_words", "top_ids", "first_top_ids", "top_logprobs", "ranks",
}  # fmt: skip
# fields of those names that are counters since start, int64 as every other count
COUNTER_FIELDS = ("DetokLoad.tokens",)
ID_FIELDS = {"request_id", "request_ids"}

edge_values = st.sampled_from([  # mutable ones are copied where drawn: never changed in place
    None, True, False, 0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1,
    -(2**31), -(2**63), 0.0, -0.0, 1.5, 1e-40, 5e-324, 1e308, math.nan, math.inf, -math.inf,
    "", "x", "prefill", "\x00", b"", b"\xff", [], [[]], [[1]], [{}], [1.5], [True], [None], {},
    {"a": 1}, {1: 2},
])  # fmt: skip
scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=8) | st.binary(max_size=8)
)  # fmt: skip
wire_values = edge_values.map(copy.deepcopy) | st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=3) | st.integers(0, 9), children, max_size=3),
    max_leaves=8,
)


@st.composite
def broken(draw, body):
    """body (a message's wire array) with 1-4 random changes at random depths: a value replaced
    by any wire value, or a list shortened, lengthened or emptied."""
    body = msgpack.unpackb(msgpack.packb(body), strict_map_key=False)  # a deep copy
    for _ in range(draw(st.integers(1, 4))):
        parent, key = None, None
        node = body
        while isinstance(node, list) and node and draw(st.integers(0, 2)):  # go deeper, 2 in 3
            parent, key = node, draw(st.integers(0, len(node) - 1))
            node = node[key]
        action = draw(st.sampled_from(["replace", "replace", "drop", "append", "empty"]))
        if action == "replace" or not isinstance(node, list):
            value = draw(wire_values)
            if parent is None:
                body = value
            else:
                parent[key] = value
        elif action == "drop" and node:
            del node[draw(st.integers(0, len(node) - 1))]
        elif action == "append":
            node.append(draw(wire_values))
        else:
            node.clear()
    return body


@st.composite
def broken_frames(draw):
    msg, arrays = draw(messages)
    frames = [bytes(f) for f in protocol.encode(msg, arrays)]
    body = msgpack.unpackb(frames[0][1:], strict_map_key=False)
    code = frames[0][0]
    if draw(st.integers(0, 9)) == 0:  # now and then a body made up from nothing
        bad = draw(wire_values)
    else:
        bad = draw(broken(body))
    extra = frames[1:] if draw(st.booleans()) else draw(st.lists(st.binary(max_size=16),
                                                                 max_size=2))  # fmt: skip
    return [bytes([code]) + msgpack.packb(bad, use_bin_type=True), *extra]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broken_frames())
def test_a_broken_message_decodes_well_typed_or_raises_protocol_error(frames):
    try:
        msg, extra = protocol.decode(frames)
    except ProtocolError:
        return
    assert_well_typed(msg)
    if isinstance(msg, protocol.PrefixHeader):
        arrays_or_error(msg, extra)
    else:
        assert extra == []


@pytest.mark.parametrize("code", sorted(MESSAGE_TYPES))
@settings(max_examples=150, deadline=None)
@given(body=wire_values)
def test_any_body_of_any_type_decodes_well_typed_or_raises_protocol_error(code, body):
    try:
        msg, _ = protocol.decode([bytes([code]) + msgpack.packb(body, use_bin_type=True)])
    except ProtocolError:
        return
    assert_well_typed(msg)


def test_every_message_type_is_fuzzed():
    """The strategies cover every type: a new message type must join them."""
    assert set(TYPE_CODES) == set(BY_TYPE)


def arrays_or_error(msg: protocol.PrefixHeader, extra: list) -> None:
    try:
        arrays = protocol.arrays_from_frames(msg.kv_meta, extra)
    except ProtocolError:
        return
    assert len(arrays) == len(msg.kv_meta)


# ---- the independent checker ------------------------------------------------------------------


def assert_well_typed(obj, where: str = "") -> None:
    cls = type(obj)
    assert dataclasses.is_dataclass(cls), f"{where}: {cls.__name__} is not a message"
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        _check(hints[f.name], getattr(obj, f.name), f.name, f"{where}{cls.__name__}.{f.name}")
    if isinstance(obj, protocol.TokenBatch):
        n = len(obj.request_ids)
        assert [len(obj.seqs), len(obj.tokens), len(obj.logprobs), len(obj.finishes)] == [n] * 4
        assert set(obj.finishes) <= set(protocol.TokenFinish)
    if isinstance(obj, protocol.TokenBatch | protocol.TextDelta | protocol.PromptScores):
        n = len(obj.token_ids if isinstance(obj, protocol.TextDelta) else obj.logprobs)
        assert len(obj.top_ids) == len(obj.top_logprobs) in (0, n)
        if isinstance(obj, protocol.PromptScores):
            assert len(obj.ranks) == n and all(r >= 1 for r in obj.ranks)
        assert [len(a) for a in obj.top_ids] == [len(b) for b in obj.top_logprobs]
    if isinstance(obj, protocol.LogitsControls):
        assert len(obj.bias_ids) == len(obj.bias_values) == len(set(obj.bias_ids))
        assert -1 <= obj.prompt_logprobs <= 20 and 0 <= obj.top_logprobs <= 20
    if isinstance(obj, protocol.PrefixHeader):
        assert obj.context == [] or len(obj.context) == obj.length
    if isinstance(obj, protocol.TextDelta):
        assert obj.logprobs == [] or len(obj.logprobs) == len(obj.token_ids)
    if isinstance(obj, protocol.HistogramSnapshot):
        assert len(obj.counts) == len(obj.buckets) + 1
    if isinstance(obj, protocol.Heartbeat | protocol.Ready | protocol.RequestFailed):
        assert obj.role in ("prefill", "decode", "detok")
    if isinstance(obj, protocol.Heartbeat):
        loads = {"prefill": obj.prefill, "decode": obj.decode, "detok": obj.detok}
        assert loads.pop(obj.role) is not None and set(map(id, loads.values())) == {id(None)}
    if isinstance(obj, protocol.SamplingParams):
        assert obj.temperature >= 0 and 2.0**-126 <= obj.top_p <= 1.0
    if isinstance(obj, protocol.GenerateRequest):
        assert obj.prompt


def _check(hint, value, name: str, where: str) -> None:
    if isinstance(hint, types.UnionType):  # X | None
        if value is None:
            return
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is list:
        assert type(value) is list, where
        (item,) = typing.get_args(hint)
        for x in value:
            _check(item, x, name, where)
        return
    if dataclasses.is_dataclass(hint):
        assert type(value) is hint, where
        assert_well_typed(value, f"{where} > ")
        return
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        assert type(value) is hint, (where, value)
        return
    if hint is int:
        assert type(value) is int and INT64[0] <= value <= INT64[1], (where, value)
        if name in INT32_FIELDS and not where.endswith(COUNTER_FIELDS):
            assert 0 <= value < 2**31, (where, value)
        return
    if hint is float:
        assert type(value) is float and not math.isnan(value) and value != math.inf, (where, value)
        if name not in ("logprobs", "first_logprob", "top_logprobs", "first_top_logprobs"):
            assert math.isfinite(value), (where, value)
        return
    if hint is str:
        assert type(value) is str, where
        value.encode("utf-8")
        if name in ID_FIELDS:
            assert value, where
        return
    if hint is bool:
        assert type(value) is bool, where
        return
    if origin is None and hint is typing.Any:
        return
    # kv_meta: list[list[Any]], [dtype name, shape]
    raise AssertionError(f"{where}: the checker does not know {hint!r}")
