"""The KV arrays of a prefix cross the transport without copies by splitserve's code: the frames
protocol.encode makes are the arrays' own memory, pyzmq sends them with copy=False, and the
receiver's arrays are np.frombuffer views of the frames it received. Over inproc (where libzmq
hands the message itself from one socket to the other) the decode side's arrays are then the
very memory the prefill side's arrays were; over tcp, the memory the socket received into.
Arrays are of the default model's layout (46,080 bytes a token), 16 tokens: above
zmq.COPY_THRESHOLD (64 KiB), under which pyzmq copies a frame on purpose (cheaper than keeping
a reference to it)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import zmq

from splitserve import protocol
from splitserve.engine.interface import SamplingParams
from splitserve.launch.ports import free_port
from splitserve.protocol import PrefixHeader, StopCriteria, TransportCounters
from splitserve.transport import Receiver, Sender

LENGTH = 16
SHAPE = (30, LENGTH, 3, 64)  # [layers, length, kv_heads, head_dim], float32, K and V each


def _prefix() -> tuple[PrefixHeader, list[np.ndarray]]:
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(SHAPE, np.float32) for _ in range(2)]
    assert all(a.nbytes > zmq.COPY_THRESHOLD for a in arrays)
    header = PrefixHeader("r-1", 0, 0, LENGTH, 0, 5, -0.5, SamplingParams(),
                          StopCriteria(max_tokens=4), protocol.kv_meta(arrays))  # fmt: skip
    return header, arrays


def _address(buffer) -> int:
    return np.frombuffer(buffer, np.uint8).ctypes.data


def _crc(arrays) -> int:
    crc = 0
    for a in arrays:
        crc = zlib.crc32(memoryview(a).cast("B"), crc)
    return crc


def _receive(receiver: Receiver) -> tuple[PrefixHeader, list, list[np.ndarray]]:
    assert receiver.poll(10_000), "nothing received in 10 s"
    ((msg, frames),) = receiver.drain()
    return msg, frames, protocol.arrays_from_frames(msg.kv_meta, frames)


def test_encode_makes_frames_of_the_arrays_own_memory():
    header, arrays = _prefix()
    frames = protocol.encode(header, arrays)
    assert [_address(f) for f in frames[1:]] == [a.ctypes.data for a in arrays]


def test_over_inproc_decode_gets_the_very_memory_prefill_sent():
    header, arrays = _prefix()
    ctx = zmq.Context()
    receiver = Receiver(ctx, "inproc://kv-zero-copy", TransportCounters())
    sender = Sender(ctx, "inproc://kv-zero-copy", TransportCounters())
    try:
        assert sender.send(header, arrays)
        msg, _, received = _receive(receiver)
        assert msg.request_id == "r-1"
        # no copy anywhere on the way: the same bytes, not equal bytes
        assert [r.ctypes.data for r in received] == [a.ctypes.data for a in arrays]
    finally:
        sender.close()
        receiver.close()
        ctx.term()


@pytest.mark.parametrize("dropped_after_send", [False, True])
def test_over_tcp_the_arrays_are_views_of_the_received_frames(dropped_after_send):
    """The receiver's arrays are the frames' memory; the sender may drop its arrays once sent
    (copy=False keeps them alive until libzmq is done with them)."""
    header, arrays = _prefix()
    crc = _crc(arrays)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    receiver = Receiver(ctx, endpoint, TransportCounters())
    sender = Sender(ctx, endpoint, TransportCounters())
    try:
        assert sender.send(header, arrays)
        if dropped_after_send:
            del arrays
        _, frames, received = _receive(receiver)
        assert [r.ctypes.data for r in received] == [_address(f.buffer) for f in frames]
        assert not any(r.flags.owndata for r in received)
        assert [r.shape for r in received] == [SHAPE, SHAPE]
        assert _crc(received) == crc
    finally:
        sender.close()
        receiver.close()
        ctx.term()
