"""Client connections: no client can hold the server's connections away from the others.

uvicorn alone has no limit on how long a request's headers may take, and its limit_concurrency
counts every open connection, so enough connections trickling a header line every few seconds made
every other client get 503 for as long as they stayed. Here each connection is in one of three
states, tracked by ConnectionGuard through GuardedProtocol (uvicorn's httptools protocol with
hooks):

- waiting: quiet (open, no byte of a request yet: just connected, or between the requests of a
  keep-alive connection), or receiving a request's headers;
- uploading: headers complete, its body still arriving;
- busy: a whole request received, its response not complete yet.

A waiting connection whose request headers are not complete within header_timeout_s of it
becoming free is closed; so is one whose body makes no progress for body_timeout_s (its request
then ends as the client's disconnect, a 499 in the log). A connection whose client's bytes wait
unread in the kernel gets one timeout more: on a loaded machine the server's loop can run
seconds late, and that delay is the server's, not the client's.

A new connection beyond max_connections_per_peer (from one client address) is refused (429): a
client sharing an address with a flood shares its limit. A new connection beyond max_connections
(in all) closes one of the few connections that have waited longest without their request's
headers (quiet, or trickling headers: what a slowloris holds): the one whose address holds the
most waiting connections, so that a flood from many addresses loses its own. A connection whose
headers are complete and whose body is arriving (what a normal client holds between its headers
and its body) goes only when no connection is waiting: choosing those first made a flood that
churns at the total, whose own connections are mostly fresh and quiet, close the normal client's
one upload again and again. Only when no connection is waiting or uploading is the newcomer
refused (503). Busy connections are bounded by admission (each holds a running or queued
request, or is answered at once), so idle and trickling connections can never lock complete
requests out.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import json
import logging
import resource
import sys
import termios
import time
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.http.errors import error_body
from splitserve.config import RouterConfig

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024  # request line and headers; httptools sets no limit of its own
SWEEP_INTERVAL_S = 0.5  # how often timed-out connections are looked for
FD_MARGIN = 256  # descriptors besides client connections: ZeroMQ sockets, logs, the listener
EVICTION_CANDIDATES = 8  # the longest-waiting connections a victim is chosen from (_evict_any)

# A connection's states while it has no whole request (a busy one is in none):
QUIET = "quiet"  # no byte of a request yet: just connected, or kept alive between requests
HEADERS = "headers"  # a request begun, its headers not complete
UPLOADING = "uploading"  # headers complete, the body arriving
# Which connections make room first: those without their headers (quiet or trickling them) in one
# queue by age, before those uploading a body (a request under way, its client at work).
WAITING = (QUIET, HEADERS)

class ConnectionGuard:
    """The server's connections by peer and state; see the module docstring."""

    def __init__(self, config: RouterConfig, max_connections: int | None = None):
        self.max_connections = max_connections or config.max_connections
        self.max_per_peer = min(config.max_connections_per_peer, self.max_connections)
        self.timeouts = {QUIET: config.header_timeout_s, HEADERS: config.header_timeout_s,
                         UPLOADING: config.body_timeout_s}  # fmt: skip
        self.open = 0
        self.by_peer: dict[str, int] = {}
        # connections without a whole request: proto -> (since when its timeout runs, state)
        self.waiting: dict[GuardedProtocol, tuple[float, str]] = {}
        # the same, in the order they entered their class (uploading or not): all, and per peer.
        # A dict keeps insertion order; a change of class or a body's progress re-inserts at the
        # end; a quiet connection beginning its headers keeps its place (a slowloris's age is
        # that of its connection, not of its latest byte).
        self.queues: dict[bool, dict[GuardedProtocol, None]] = {True: {}, False: {}}
        self.peer_queues: dict[str, dict[bool, dict[GuardedProtocol, None]]] = {}
        self.counts = {"timed_out": 0, "evicted": 0, "refused": 0}
        self._sweeping: asyncio.TimerHandle | None = None

    # ---- a connection's life ----
    def admit(self, proto: GuardedProtocol) -> str | None:
        """Count a new connection, making room if needed; the reason if it must be refused."""
        if self._sweeping is None:
            self._schedule_sweep()
        peer = proto.peer
        if self.by_peer.get(peer, 0) >= self.max_per_peer:
            # refused, not made room for: a peer reconnecting in a loop would otherwise close its
            # connections as fast as it opens them, a churn that starves everyone's requests
            self.counts["refused"] += 1
            return "peer"
        if self.open >= self.max_connections and not self._evict_any():
            self.counts["refused"] += 1
            return "total"
        self.open += 1
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        proto.counted = True
        self.mark(proto, QUIET)
        return None

    def mark(self, proto: GuardedProtocol, state: str) -> None:
        """proto is in `state` from now on; for UPLOADING also: its body made progress now. A
        request's headers are timed from when the connection became free, not from their start."""
        if not proto.counted:
            return
        now = time.monotonic()
        previous = self.waiting.get(proto)
        since = previous[0] if state == HEADERS and previous is not None else now
        self.waiting[proto] = (since, state)
        uploading = state == UPLOADING
        if previous is not None and state == HEADERS and previous[1] in WAITING:
            return  # same class, same place in its queues
        self._leave_queues(proto, previous)
        self.queues[uploading][proto] = None
        peer_queues = self.peer_queues.get(proto.peer)
        if peer_queues is None:
            peer_queues = self.peer_queues[proto.peer] = {True: {}, False: {}}
        peer_queues[uploading][proto] = None

    def busy(self, proto: GuardedProtocol) -> None:
        """proto has a whole request: it is served, never closed to make room."""
        previous = self.waiting.pop(proto, None)
        if previous is not None:
            self._leave_queues(proto, previous)

    def forget(self, proto: GuardedProtocol) -> None:
        """proto's connection is gone (or being closed by the guard)."""
        if not proto.counted:
            return
        proto.counted = False
        self.busy(proto)
        self.open -= 1
        left = self.by_peer[proto.peer] - 1
        if left:
            self.by_peer[proto.peer] = left
        else:
            del self.by_peer[proto.peer]

    def _leave_queues(self, proto: GuardedProtocol, entry: tuple[float, str] | None) -> None:
        if entry is None:
            return
        uploading = entry[1] == UPLOADING
        del self.queues[uploading][proto]
        peer_queues = self.peer_queues[proto.peer]
        del peer_queues[uploading][proto]
        if not peer_queues[True] and not peer_queues[False]:
            del self.peer_queues[proto.peer]

    # ---- making room, and timeouts ----
    def _evict_any(self) -> bool:
        """Close a connection without a whole request (one without its headers first, one
        uploading a body only when there is none); False if there is none. Among the few that
        have waited longest, the one whose address holds the most such connections: a flood
        from many addresses then loses its own, not the one connection of a client that happens
        to be oldest just then."""
        queue = self.queues[False] or self.queues[True]
        if not queue:
            return False
        oldest = list(itertools.islice(queue, EVICTION_CANDIDATES))
        self._evict(max(oldest, key=self._waiting_at_address))  # the first of ties
        return True

    def _waiting_at_address(self, proto: GuardedProtocol) -> int:
        queues = self.peer_queues[proto.peer]
        return len(queues[True]) + len(queues[False])

    def _evict(self, victim: GuardedProtocol) -> None:
        self.counts["evicted"] += 1
        self._close(victim)

    def _close(self, proto: GuardedProtocol) -> None:
        self.forget(proto)  # now: its connection_lost comes a loop pass later
        proto.close_quietly()

    def _schedule_sweep(self) -> None:
        loop = asyncio.get_running_loop()
        self._sweeping = loop.call_later(SWEEP_INTERVAL_S, self.sweep)

    def sweep(self) -> None:
        """Close the connections past their state's timeout, then look again in a while (a scan
        of at most max_connections entries twice a second)."""
        now = time.monotonic()
        timeouts = self.timeouts
        expired = [
            p for p, (since, state) in self.waiting.items() if now - since > timeouts[state]
            # bytes that came in time but that this process has not read yet (its loop running
            # late, on a loaded machine) are the server's delay, not the client's stall; for
            # one more timeout only, so that a trickle too fast to be caught unread is no way
            # around the timeout
            and (now - since > 2 * timeouts[state] or not p.has_unread_bytes())
        ]  # fmt: skip
        for proto in expired:
            self._close(proto)
        self.counts["timed_out"] += len(expired)
        self._report()
        self._schedule_sweep()

    def _report(self) -> None:
        """One log line per sweep for what happened since the last, not one per connection."""
        counts = self.counts
        if not any(counts.values()):
            return
        level = logging.WARNING if counts["refused"] else logging.INFO
        log.log(level, "client connections: %d timed out (headers %.0f s, body %.0f s), %d closed"
                " to make room, %d refused; %d open", counts["timed_out"],
                self.timeouts[HEADERS], self.timeouts[UPLOADING], counts["evicted"],
                counts["refused"], self.open)  # fmt: skip
        self.counts = dict.fromkeys(counts, 0)

    def close(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, reporting each connection's state to a ConnectionGuard and
    refusing request headers larger than MAX_HEADER_BYTES (431)."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.peer = ""
        self.counted = False
        self._header_bytes: int | None = 0  # None once this request's headers are complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = self.client[0] if self.client else ""
        refused = self.guard.admit(self)
        if refused == "peer":
            self._refuse(429, "too many connections from your address: try again later")
        elif refused == "total":
            self._refuse(503, "too many connections: try again later")

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_bytes is not None and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                self._refuse(431, f"request headers larger than {MAX_HEADER_BYTES} bytes")

    # parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self.cycle is None or self.cycle.response_complete:  # not one pipelined behind
            self.guard.mark(self, HEADERS)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._header_bytes = None
        self.guard.mark(self, UPLOADING)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self.guard.mark(self, UPLOADING)  # progress

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.cycle is not None and not self.cycle.response_complete:
            self.guard.busy(self)
        # else its response went out before its body was all in (a 413): the connection is
        # waiting already, and stays so

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.guard.busy(self)  # a pipelined request started
        else:
            self.guard.mark(self, QUIET)  # free for its next request

    def has_unread_bytes(self) -> bool:
        """Bytes from the client wait in the kernel, not read yet (FIONREAD)."""
        sock = self.transport.get_extra_info("socket")
        if sock is None or self.transport.is_closing():
            return False
        try:
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(waiting, sys.byteorder) > 0

    # closing
    def close_quietly(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer with an error and close: for a connection the app has not seen (or whose
        headers are too large to parse), so nothing else writes to it."""
        self.guard.forget(self)
        if self.cycle is not None and not self.cycle.response_complete:
            self.close_quietly()  # a pipelined request's response is being written
            return
        code = "headers_too_large" if status == 431 else "too_many_connections"
        body = json.dumps(error_body(message, code=code)).encode()
        phrase = {429: "Too Many Requests", 431: "Request Header Fields Too Large",
                  503: "Service Unavailable"}[status]  # fmt: skip
        head = (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()  # fmt: skip
        self.transport.write(head + body)
        self.close_quietly()


def guarded_protocol(guard: ConnectionGuard) -> Callable[..., GuardedProtocol]:
    """The `http` argument of uvicorn.Config: its protocol class, bound to the guard."""

    def create(*args: Any, **kwargs: Any) -> GuardedProtocol:
        return GuardedProtocol(*args, guard=guard, **kwargs)

    return create


def connection_capacity(wanted: int) -> int:
    """How many client connections this process can hold: wanted, after raising the soft limit
    on open files as far as the hard limit allows (a full descriptor table makes accept() fail,
    and asyncio then stops accepting for a while: a denial of service of its own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_MARGIN
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit to %d: %s", target, exc)
    if soft != resource.RLIM_INFINITY and soft < need:
        capacity = max(1, soft - FD_MARGIN)
        log.warning("open-file limit %d: max_connections lowered from %d to %d", soft, wanted,
                    capacity)  # fmt: skip
        return capacity
    return wanted
