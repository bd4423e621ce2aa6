"""The wire codec: every message survives a round trip, and malformed frames raise ProtocolError."""

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings

from splitserve import protocol
from splitserve.protocol import (
    DetokParams,
    GenerateRequest,
    PrefixHeader,
    ProtocolError,
    StopCriteria,
)
from splitserve.protocol.field_specs import MAX_WIRE_DECODE_WORKERS
from splitserve.protocol.params import SamplingParams
from tests.wire_strategies import messages


@settings(max_examples=300, deadline=None)
@given(messages)
def test_every_message_survives_a_round_trip(message):
    msg, arrays = message
    frames = protocol.encode(msg, arrays)
    back, extra = protocol.decode(frames)
    assert back == msg
    assert type(back) is type(msg)
    assert len(extra) == len(arrays)
    for sent, got in zip(arrays, protocol.arrays_from_frames(back.kv_meta, extra) if arrays
                         else [], strict=True):  # fmt: skip
        np.testing.assert_array_equal(sent, got)


def test_kv_arrays_travel_as_extra_frames_without_a_copy():
    kv = [np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.ones((2, 3, 4), np.float32)]
    header = PrefixHeader("r", 0, 0, 3, 0, 7, -0.5, SamplingParams(), StopCriteria(4),
                          protocol.kv_meta(kv))  # fmt: skip
    frames = protocol.encode(header, kv)
    back, extra = protocol.decode(frames)
    arrays = protocol.arrays_from_frames(back.kv_meta, extra)
    for sent, got in zip(kv, arrays, strict=True):
        np.testing.assert_array_equal(sent, got)


def _frame(code: int, body) -> list[bytes]:
    return [bytes([code]) + msgpack.packb(body, use_bin_type=True)]


good_request = GenerateRequest(
    "r", 0, 0, 0, [1, 2], 0, SamplingParams(), StopCriteria(4), DetokParams()
)


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b""],
        [b"\xee"],  # unknown type
        [b"\x01not msgpack"],
        _frame(1, {"request_id": "r"}),  # a map, not an array
        _frame(1, ["r", 0]),  # too few fields
        _frame(1, [*protocol._CODECS[GenerateRequest].to_wire(good_request), 1, 2]),  # too many
        _frame(1, ["r", "zero", 0, 0, [1], 0, [0.0, 1.0, 0, 1], [4], [], False]),  # str for int
        _frame(1, ["r", 0, 0, 0, 5, 0, [0.0, 1.0, 0, 1], [4], [], False]),  # int for a list
        _frame(1, ["r", 0, 0, 0, [1], 0, "sampling", [4], [], False]),  # str for a message
        _frame(1, ["r", 0, 0, 0, [1], 0, [0.0, 1.0, 0, 1], ["four"], [], False]),  # bad nested
        _frame(4, [["not a delta"]]),  # a list of nested messages holding a str
        _frame(9, ["decode", 0, 1, 3, 0.0, False, [0, 0, 0, 0], ["not", "a", "load"]]),
        _frame(4, [[["r", 0, 0, "x", [1], [], 9]]]),  # 9 is no finish reason
        _frame(3, [7, 0, [], [], [], [], [], []]),  # 7 is no source
    ],
)
def test_malformed_frames_raise_protocol_error(frames):
    with pytest.raises(ProtocolError):
        protocol.decode(frames)


def _wire(msg) -> list:
    return msgpack.unpackb(protocol.encode(msg)[0][1:], strict_map_key=False)


def _changed(msg, *path_value) -> list[bytes]:
    """msg's frame with the wire value at each path (indices into nested arrays) replaced."""
    body = _wire(msg)
    for path, value in zip(path_value[::2], path_value[1::2], strict=True):
        node = body
        for i in path[:-1]:
            node = node[i]
        node[path[-1]] = value
    return [bytes([protocol.TYPE_CODES[type(msg)]]) + msgpack.packb(body, use_bin_type=True)]


good_batch = protocol.TokenBatch(protocol.Source.DECODE, 3, ["a", "b"], [0, 0], [1, 1], [5, 6],
                                 [-0.5, -1.0], [0, 2])  # fmt: skip
good_delta = protocol.TextBatch([protocol.TextDelta("a", 0, 0, "hi", [5, 6], [-0.5, -1.0])])
good_header = PrefixHeader("r", 0, 0, 2, 0, 7, -0.5, SamplingParams(), StopCriteria(4),
                           [["<f4", [2, 1]]])  # fmt: skip
hist = protocol.HistogramSnapshot([0.1, 0.2], [1, 2, 3], 0.5, 6, 0.1, 0.2, 0.2)
good_beat = protocol.Heartbeat("prefill", 0, 9, protocol.PROTOCOL_VERSION, 0.01, False,
                               protocol.TransportCounters(),
                               prefill=protocol.PrefillLoad(0, 0, 1, 0, hist),
                               incarnation="i" * protocol.INCARNATION_CHARS)  # fmt: skip

# Well-formed MessagePack, wrong in one value: each crashed a worker or fooled a handler before
# the decoder checked element types and ranges.
WELL_FORMED_BUT_WRONG = {
    "TokenBatch request_ids [[1]]": _changed(good_batch, [2], [[1], [2]]),
    "Abort([[1]])": [b"\x05" + msgpack.packb([[[1]], [0]])],
    "Finish([{}])": [b"\x06" + msgpack.packb([[{}], [0]])],
    "an Abort of more ids than epochs": [b"\x05" + msgpack.packb([["a", "b"], [0]])],
    "a prompt of floats": _changed(good_request, [4], [1.5, 2.0]),
    "an empty prompt": _changed(good_request, [4], []),
    "a bool for a token id": _changed(good_request, [4], [True, 2]),
    "top_k 2**40": _changed(good_request, [6, 2], 2**40),
    "top_p 1e-40 (a subnormal the sampler flushes to 0)": _changed(good_request, [6, 1], 1e-40),
    "top_p NaN": _changed(good_request, [6, 1], float("nan")),
    "temperature -1": _changed(good_request, [6, 0], -1.0),
    "a negative detok index": _changed(good_request, [3], -1),
    "a bool for the detok index": _changed(good_request, [3], True),
    "a negative epoch": _changed(good_request, [1], -1),
    "a negative start_seq": _changed(good_request, [5], -1),
    "a stop string of 0 characters": _changed(good_request, [8, 1], [""]),
    "an int beyond int64": _changed(good_batch, [1], 2**64 - 1),
    "a token id beyond int32": _changed(good_batch, [5], [5, 2**31]),
    "a negative sequence number": _changed(good_batch, [4], [1, -1]),
    "columns of different lengths": _changed(good_batch, [5], [5]),
    "an epoch column of another length": _changed(good_batch, [3], [0]),
    "NaN among logprobs": _changed(good_batch, [6], [float("nan"), -1.0]),
    "+inf among logprobs": _changed(good_batch, [6], [float("inf"), -1.0]),
    "a finish that is no TokenFinish": _changed(good_batch, [7], [0, 3]),
    "a delta's logprobs not one per token": _changed(good_delta, [0, 0, 5], [-0.5]),
    "a detok worker's ERROR finish": _changed(good_delta, [0, 0, 6], 4),
    "kv_meta of a bare string": _changed(good_header, [9], ["<f4"]),
    "kv_meta with a negative dimension": _changed(good_header, [9, 0, 1], [-2, 1]),
    "kv_meta of no arrays": _changed(good_header, [9], []),
    "a heartbeat from no role": _changed(good_beat, [0], "router"),
    "a prefill heartbeat with a decode load": _changed(good_beat, [0], "decode"),
    "a histogram with a count missing": _changed(good_beat, [7, 4, 1], [1, 2]),
    "histogram buckets out of order": _changed(good_beat, [7, 4, 0], [0.2, 0.1]),
    "a negative loop age": _changed(good_beat, [4], -1.0),
    "prefixes waiting for more decode workers than the wire allows": _changed(
        good_beat, [7, 15], [0] * (MAX_WIRE_DECODE_WORKERS + 1)
    ),
    "a negative count of waiting prefixes": _changed(good_beat, [7, 15], [1, -1]),
}


@pytest.mark.parametrize("frames", WELL_FORMED_BUT_WRONG.values(), ids=WELL_FORMED_BUT_WRONG)
def test_well_formed_but_wrong_messages_raise_protocol_error(frames):
    with pytest.raises(ProtocolError):
        protocol.decode(frames)


def test_the_prefix_header_announces_its_frames():
    """Its KV arrays come as extra frames, one per kv_meta entry; no other message has any."""
    frames = protocol.encode(good_header, [np.zeros((2, 1), np.float32)])
    protocol.decode(frames)
    with pytest.raises(ProtocolError):
        protocol.decode(frames[:1])
    with pytest.raises(ProtocolError):
        protocol.decode([*frames, b"more"])
    with pytest.raises(ProtocolError):
        protocol.decode([*protocol.encode(good_batch), b"junk"])


def test_every_good_example_decodes():
    for msg in (good_request, good_batch, good_delta, good_beat):
        assert protocol.decode(protocol.encode(msg))[0] == msg


def test_a_well_formed_request_decodes_with_defaults_filled_in():
    body = protocol._CODECS[GenerateRequest].to_wire(good_request)[:-1]  # logprobs left out
    msg, _ = protocol.decode(_frame(1, body))
    assert msg == good_request
