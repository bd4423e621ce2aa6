"""The two ends of the KV transfer benchmark (lab/hosts/kv_transfer.py), each its own
process, run in its own network namespace. They use the workers' own transport: the sender
sends a PrefixHeader and its arrays through transport.Sender as prefill_worker's send_prefix
does (protocol.encode, then send_frames: copy=False); the receiver takes them through
transport.Receiver.drain_from and protocol.arrays_from_frames as decode_worker does.

    python -m lab.hosts.kv_peer receive --bind tcp://10.0.0.2:5552 --acks tcp://10.0.0.1:5553
    python -m lab.hosts.kv_peer send --to tcp://10.0.0.2:5552 --acks tcp://10.0.0.1:5553 \
        --layout 30,3,64,float32 --lengths 128 512 2048 --repeats 10

Each transfer is acknowledged (over a plain socket of its own, outside what is measured) before
the next one starts, so transfers never overlap. The time of one is from just before encode on
the sender to the arrays rebuilt on the receiver: time.perf_counter() is CLOCK_MONOTONIC, one
clock for every process of a machine, namespaces or not. Apart, the time the sender's own thread
spends in encode and send: what the prefill worker's loop pays. Each side also says whether its
arrays and the frames are the same memory (no copy of the arrays by splitserve's code); the
sender prints one JSON line per transfer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib

import msgpack
import numpy as np
import zmq

from splitserve import protocol
from splitserve.engine.interface import SamplingParams
from splitserve.protocol import PrefixHeader, StopCriteria, TransportCounters
from splitserve.security import curve_client, curve_server
from splitserve.transport import Receiver, Sender

WARMUP = 2  # transfers per length before those measured (connection, CURVE handshake, pages)


def address(a: np.ndarray | memoryview) -> int:
    """Where the first byte of an array or a buffer lies."""
    return np.frombuffer(a, np.uint8).ctypes.data if isinstance(a, memoryview) else a.ctypes.data


def layout(spec: str, length: int) -> list[tuple[np.dtype, tuple[int, ...]]]:
    """"layers,kv_heads,head_dim,dtype": K and V as JaxEngine.kv_layout makes them."""
    layers, heads, dim, dtype = spec.split(",")
    return [(np.dtype(dtype), (int(layers), length, int(heads), int(dim)))] * 2


def _header(request_id: str, length: int, arrays: list[np.ndarray]) -> PrefixHeader:
    return PrefixHeader(request_id, 0, 0, length, 0, 1, -0.5, SamplingParams(),
                        StopCriteria(max_tokens=16), protocol.kv_meta(arrays))  # fmt: skip


def _crc(arrays) -> int:
    crc = 0
    for a in arrays:
        crc = zlib.crc32(memoryview(a).cast("B"), crc)
    return crc


def send(args) -> None:
    ctx = zmq.Context()
    curve = curve_client(args.keys, args.to, ("prefill", 0), ("decode", 0)) if args.keys else None
    sender = Sender(ctx, args.to, TransportCounters(), curve)
    acks = ctx.socket(zmq.PULL)
    acks.bind(args.acks)
    rng = np.random.default_rng(0)
    for length in args.lengths:
        # random bytes: nothing on the way could make them smaller
        arrays = [rng.standard_normal(shape, np.float32).astype(dt)
                  for dt, shape in layout(args.layout, length)]  # fmt: skip
        crc = _crc(arrays)
        for rep in range(-WARMUP, args.repeats):
            rid = f"kv-{length}-{rep}-{crc}"
            start = time.perf_counter()
            frames = protocol.encode(_header(rid, length, arrays), arrays)
            assert sender.send_frames(frames), "send dropped"  # Sender.send's own two steps
            queued = time.perf_counter() - start  # what prefill's loop spends: it never waits
            views = all(address(f) == address(a) for f, a in zip(frames[1:], arrays, strict=True))
            if not acks.poll(120_000):
                sys.exit(f"no acknowledgement of {rid} in 120 s")
            got_rid, received_at, recv_views, crc_ok = msgpack.unpackb(acks.recv())
            assert got_rid == rid and crc_ok, f"transfer {rid} arrived wrong"
            if rep >= 0:
                print(json.dumps({
                    "tokens": length, "bytes": sum(a.nbytes for a in arrays),
                    "frames": len(frames), "seconds": received_at - start, "loop_seconds": queued,
                    "send_views": views, "receive_views": recv_views,
                }), flush=True)  # fmt: skip
    sender.close()
    acks.close(linger=0)
    ctx.term()


def receive(args) -> None:
    ctx = zmq.Context()
    curve = curve_server(args.keys, args.bind, "decode", 0) if args.keys else None
    receiver = Receiver(ctx, args.bind, TransportCounters(), -1, curve)
    acks = ctx.socket(zmq.PUSH)
    acks.connect(args.acks)
    while True:
        if not receiver.poll(1000):
            continue
        for msg, frames, _sender in receiver.drain_from():
            arrays = protocol.arrays_from_frames(msg.kv_meta, frames)
            received_at = time.perf_counter()
            pairs = zip(arrays, frames, strict=True)
            views = all(address(a) == address(f.buffer) for a, f in pairs)
            crc_ok = msg.request_id.rsplit("-", 1)[1] == str(_crc(arrays))
            acks.send(msgpack.packb([msg.request_id, received_at, views, crc_ok]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("side", choices=["send", "receive"])
    p.add_argument("--to", help="the receiver's endpoint (send)")
    p.add_argument("--bind", help="the endpoint to receive on (receive)")
    p.add_argument("--acks", required=True, help="the sender binds it, the receiver connects")
    p.add_argument("--keys", default="", help="CURVE keys of prefill-0 and decode-0 (else none)")
    p.add_argument("--layout", default="30,3,64,float32", help="layers,kv_heads,head_dim,dtype")
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    send(args) if args.side == "send" else receive(args)


if __name__ == "__main__":
    main()
