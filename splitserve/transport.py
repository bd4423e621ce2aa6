"""ZeroMQ plumbing shared by every role: a bound PULL receiver and non-blocking PUSH senders.

A receiver binds; its senders connect, so ZeroMQ itself reconnects to a restarted peer. Sends never
block: when a peer is slow or gone and the send queue is full, the message is dropped and counted,
and the count travels in heartbeats, so a dead peer is a visible condition, never a stalled loop.
A caller that keeps what the queue refuses, to send it later, offers it instead (Sender.offer).

On tcp with the cluster's keys both ends speak CURVE (splitserve/security.py): a receiver lets in
only the cluster's processes that send to it, and tells who sent each message (drain_from). An
ipc socket is made readable and writable by its owner only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import zmq

from splitserve import protocol
from splitserve.config import bind_address
from splitserve.protocol import TransportCounters
from splitserve.security import CurveClient, CurveServer, ZapHandler

log = logging.getLogger(__name__)

SEND_HWM = 100_000  # messages queued per peer before sends start dropping (control messages;
# the prefill worker's prefix senders queue far fewer: message_limits.prefix_send_hwm)
RECV_HWM = 100_000

Received = tuple[Any, list[Any], str | None]  # (message, extra frames, sender's name or None)


class Receiver:
    """A bound PULL socket that yields decoded messages; malformed ones are counted and skipped."""

    def __init__(
        self, ctx: zmq.Context, endpoint: str, counters: TransportCounters,
        max_message_bytes: int = -1, curve: CurveServer | None = None,
    ):  # fmt: skip
        self.zap = ZapHandler(ctx, curve.keyring) if curve is not None else None
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, RECV_HWM)
        # a peer sending a bigger frame is disconnected (splitserve/message_limits.py)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if curve is not None:
            curve.apply(self.socket)
        self.socket.bind(bind_address(endpoint))
        if endpoint.startswith("ipc://"):
            # connecting needs write permission on the socket file: the owner's alone
            os.chmod(endpoint.removeprefix("ipc://"), 0o600)
        self.counters = counters

    def poll(self, timeout_ms: int) -> bool:
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def pending(self) -> bool:
        """A message waits now. Reading until this says no is also what re-arms the socket's
        file descriptor (ZMQ_FD) for an event loop's reader."""
        return not self.socket.closed and bool(self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    def drain(self, limit: int = 1000) -> list[tuple[Any, list[Any]]]:
        """Every message waiting now (up to limit), without blocking."""
        return [(msg, frames) for msg, frames, _ in self.drain_from(limit)]

    def drain_from(self, limit: int = 1000) -> list[Received]:
        """drain(), each message with its sender: the process name its CURVE key authenticated
        (`decode-1`), or None where the transport names no one (ipc, inproc)."""
        out = []
        identified = self.zap is not None
        for _ in range(limit):
            # asking first costs half of what a raised Again does, and most passes find nothing
            if not self.pending():
                break
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.counters.received += 1
            try:
                msg, extra = protocol.decode(frames)
            except protocol.ProtocolError as exc:
                self.counters.malformed += 1
                log.warning("dropped malformed message: %s", exc)
                continue
            out.append((msg, extra, frames[0].get("User-Id") if identified else None))
        return out

    def close(self) -> None:
        self.socket.close(linger=0)
        if self.zap is not None:
            self.zap.close()


class Sender:
    """A connected PUSH socket whose sends never block (drops are counted). hwm: the messages
    it queues for a peer that does not take them (set before connecting: ZeroMQ sizes the
    queue when it makes it)."""

    def __init__(
        self, ctx: zmq.Context, endpoint: str, counters: TransportCounters,
        curve: CurveClient | None = None, hwm: int = SEND_HWM,
    ):  # fmt: skip
        self.endpoint = endpoint
        self.socket = ctx.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, hwm)
        if curve is not None:
            curve.apply(self.socket)
        self.socket.connect(endpoint)
        self.counters = counters

    def send(self, msg: Any, arrays: list | None = None) -> bool:
        return self.send_frames(protocol.encode(msg, arrays))

    def send_frames(self, frames: list[Any]) -> bool:
        if self.offer(frames):
            return True
        self.counters.dropped += 1
        log.warning("send to %s dropped: peer slow or gone", self.endpoint)
        return False

    def offer(self, frames: list[Any]) -> bool:
        """Queue the frames if the socket's queue has room now. False, with nothing counted or
        logged, when it has none: for a caller that keeps them and offers them again
        (prefill_worker/outbox.py), a full queue is no drop."""
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self.counters.sent += 1
        return True

    def close(self) -> None:
        self.socket.close(linger=0)
