"""The wire codec: every message survives a round trip, and malformed frames raise ProtocolError."""

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve import protocol
from splitserve.engine.interface import SamplingParams
from splitserve.protocol import (
    Abort,
    DetokParams,
    Finish,
    GenerateRequest,
    Heartbeat,
    OpenStream,
    PrefixHeader,
    ProtocolError,
    Ready,
    RequestFailed,
    StopCriteria,
    TextBatch,
    TextDelta,
    TokenBatch,
)

ids = st.text(min_size=1, max_size=40)
ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
floats = st.floats(allow_nan=False, width=32)
token_lists = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=300)

sampling = st.builds(SamplingParams, floats, floats, ints, st.integers(0, 2**32 - 1))
stops = st.builds(StopCriteria, ints, ints, st.booleans(), token_lists, token_lists)
detoks = st.builds(DetokParams, st.booleans(), st.lists(st.text(max_size=8)), st.booleans(), ints)
opens = st.builds(OpenStream, ids, ints, ints, detoks, st.booleans())
deltas = st.builds(TextDelta, ids, ints, ints, st.text(), token_lists, st.lists(floats),
                   st.sampled_from([protocol.FinishReason.NONE, protocol.FinishReason.STOP,
                                    protocol.FinishReason.LENGTH]))  # fmt: skip
counts = st.integers(0, 2**40)
histograms = st.builds(protocol.HistogramSnapshot, st.lists(floats, max_size=4),
                       st.lists(counts, max_size=5), floats, counts, floats, floats, floats)
transports = st.builds(protocol.TransportCounters, counts, counts, counts, counts)
prefill_loads = st.builds(protocol.PrefillLoad, counts, counts, counts, counts, histograms)
decode_loads = st.builds(protocol.DecodeLoad, *[counts] * 12, histograms, histograms, histograms)
detok_loads = st.builds(protocol.DetokLoad, *[counts] * 8, histograms)
infos = st.builds(protocol.WorkerInfo, counts, counts, counts, st.text(max_size=20))


@st.composite
def heartbeats(draw):
    role = draw(st.sampled_from(["prefill", "decode", "detok"]))
    loads = {"prefill": prefill_loads, "decode": decode_loads, "detok": detok_loads}
    return Heartbeat(role, draw(ints), draw(ints), draw(ints), draw(floats), draw(st.booleans()),
                     draw(transports), **{role: draw(loads[role])})  # fmt: skip


@st.composite
def token_batches(draw):
    n = draw(st.integers(0, 70))
    column = lambda s: draw(st.lists(s, min_size=n, max_size=n))  # noqa: E731
    return TokenBatch(
        draw(st.sampled_from(list(protocol.Source))),
        draw(ints),
        column(ids),
        column(ints),
        column(ints),
        column(ints),
        column(floats),
        column(st.integers(0, 2)),
        draw(st.lists(opens, max_size=3)),
    )


messages = st.one_of(
    st.builds(GenerateRequest, ids, ints, ints, ints, token_lists, ints, sampling, stops, detoks,
              st.booleans()),
    st.builds(PrefixHeader, ids, ints, ints, ints, ints, ints, floats, sampling, stops,
              st.lists(st.tuples(st.just("<f4"), st.lists(ints, max_size=4)).map(list))),
    token_batches(),
    st.builds(TextBatch, st.lists(deltas, max_size=10)),
    st.builds(Abort, st.lists(ids), st.lists(ints)),
    st.builds(Finish, st.lists(ids), st.lists(ints)),
    st.builds(RequestFailed, st.lists(ids), st.lists(ints), st.text(), st.text()),
    st.builds(protocol.ResumeStream, ids, ints, ints, detoks, st.booleans(), token_lists, ints),
    st.builds(protocol.Repin, st.lists(ids), st.lists(ints), st.lists(ints), st.lists(ints)),
    st.builds(protocol.DetokPool, st.lists(st.text(max_size=30))),
    st.builds(Ready, st.text(), ints, ints, ints, infos),
    heartbeats(),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(messages)
def test_every_message_survives_a_round_trip(msg):
    frames = protocol.encode(msg)
    back, extra = protocol.decode(frames)
    assert back == msg
    assert type(back) is type(msg)
    assert extra == []


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


def test_a_well_formed_request_decodes_with_defaults_filled_in():
    body = protocol._CODECS[GenerateRequest].to_wire(good_request)[:-1]  # logprobs left out
    msg, _ = protocol.decode(_frame(1, body))
    assert msg == good_request
