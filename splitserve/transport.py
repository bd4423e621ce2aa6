"""ZeroMQ plumbing shared by every role: a bound PULL receiver and non-blocking PUSH senders.

A receiver binds; its senders connect, so ZeroMQ itself reconnects to a restarted peer. Sends never
block: when a peer is slow or gone and the send queue is full, the message is dropped and counted,
and the count travels in heartbeats, so a dead peer is a visible condition, never a stalled loop.
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from splitserve import protocol
from splitserve.config import bind_address
from splitserve.protocol import TransportCounters

log = logging.getLogger(__name__)

SEND_HWM = 100_000  # messages queued per peer before sends start dropping
RECV_HWM = 100_000


class Receiver:
    """A bound PULL socket that yields decoded messages; malformed ones are counted and skipped."""

    def __init__(
        self, ctx: zmq.Context, endpoint: str, counters: TransportCounters,
        max_message_bytes: int = -1,
    ):  # fmt: skip
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, RECV_HWM)
        # a peer sending a bigger frame is disconnected (splitserve/message_limits.py)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.socket.bind(bind_address(endpoint))
        self.counters = counters

    def poll(self, timeout_ms: int) -> bool:
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def pending(self) -> bool:
        """A message waits now. Reading until this says no is also what re-arms the socket's
        file descriptor (ZMQ_FD) for an event loop's reader."""
        return not self.socket.closed and bool(self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    def drain(self, limit: int = 1000) -> list[tuple[Any, list[Any]]]:
        """Every message waiting now (up to limit), without blocking."""
        out = []
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
                out.append(protocol.decode(frames))
            except protocol.ProtocolError as exc:
                self.counters.malformed += 1
                log.warning("dropped malformed message: %s", exc)
        return out

    def close(self) -> None:
        self.socket.close(linger=0)


class Sender:
    """A connected PUSH socket whose sends never block (drops are counted)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, counters: TransportCounters):
        self.endpoint = endpoint
        self.socket = ctx.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, SEND_HWM)
        self.socket.connect(endpoint)
        self.counters = counters

    def send(self, msg: Any, arrays: list | None = None) -> bool:
        return self.send_frames(protocol.encode(msg, arrays))

    def send_frames(self, frames: list[Any]) -> bool:
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.counters.dropped += 1
            log.warning("send to %s dropped: peer slow or gone", self.endpoint)
            return False
        self.counters.sent += 1
        return True

    def close(self) -> None:
        self.socket.close(linger=0)


@dataclass(order=True)
class _Held:
    due: float
    order: int
    frames: list[Any] = field(compare=False)


class FaultySender:
    """Test-only fault injection around a Sender: delays every message, or swaps pairs.

    Configured by the SPLITSERVE_FAULTS environment variable (see faults_from_env); the owning loop
    calls tick() each pass to release what is due. Never used unless that variable is set.
    """

    def __init__(self, inner: Sender, delay_s: float = 0.0, reorder: bool = False):
        self.inner = inner
        self.delay_s = delay_s
        self.reorder = reorder
        self.counters = inner.counters
        self.endpoint = inner.endpoint
        self._held: list[_Held] = []
        self._order = 0
        self._swap: list[Any] | None = None
        self._swap_since = 0.0

    def send(self, msg: Any, arrays: list | None = None) -> bool:
        return self.send_frames(protocol.encode(msg, arrays))

    def send_frames(self, frames: list[Any]) -> bool:
        # memoryviews may point into buffers the caller reuses: hold bytes copies
        frames = [bytes(f) for f in frames]
        if not self.reorder:
            self._hold(frames)
        elif self._swap is None:
            self._swap, self._swap_since = frames, time.monotonic()
        else:  # the later message goes out first
            first, self._swap = self._swap, None
            self._hold(frames)
            self._hold(first)
        return True

    def _hold(self, frames: list[Any]) -> None:
        self._order += 1
        heapq.heappush(self._held, _Held(time.monotonic() + self.delay_s, self._order, frames))

    def tick(self) -> None:
        now = time.monotonic()
        if self._swap is not None and now - self._swap_since > 0.05:  # no partner came: let it go
            self._hold(self._swap)
            self._swap = None
        while self._held and self._held[0].due <= now:
            self.inner.send_frames(heapq.heappop(self._held).frames)

    def close(self) -> None:
        self.inner.close()


def faults_from_env(environ: dict[str, str]) -> dict[str, float]:
    """Parse SPLITSERVE_FAULTS, e.g. "prefill_to_detok_delay=0.3,decode_to_detok_reorder=1"."""
    spec = environ.get("SPLITSERVE_FAULTS", "")
    faults: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition("=")
        faults[key.strip()] = float(value or 1)
    return faults


def detok_sender(
    ctx: zmq.Context,
    endpoint: str,
    counters: TransportCounters,
    faults: dict[str, float],
    path: str,
) -> Sender | FaultySender:
    """A sender to a detok worker, wrapped in fault injection when the environment asks for it.

    path is "prefill_to_detok" or "decode_to_detok".
    """
    sender = Sender(ctx, endpoint, counters)
    delay = faults.get(f"{path}_delay", 0.0)
    reorder = bool(faults.get(f"{path}_reorder", 0.0))
    if delay or reorder:
        log.warning("fault injection on %s: delay %.3fs reorder %s", path, delay, reorder)
        return FaultySender(sender, delay_s=delay, reorder=reorder)
    return sender
