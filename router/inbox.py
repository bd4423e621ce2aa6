"""The router's inbox: a thread of its own reads the workers' messages, so that when each arrived
is known whatever the event loop is doing.

A worker is judged alive by the arrival of its heartbeats (router/liveness.py). Read on the event
loop, a heartbeat that waited in the socket while the loop served thousands of clients, answered
a flood, or was starved of the CPU looked late, and healthy workers were declared dead. Here:
 1. The thread polls the router's receiver and reads every message waiting (malformed ones are
    counted and dropped by the receiver).
 2. It notes the arrival of each Ready and Heartbeat in the HeartbeatClock, under the sender's
    role, index and incarnation (with CURVE, only from the process the message names).
 3. It queues the messages for the event loop, waking it once per batch; the loop dispatches up
    to READ_BATCH of them a turn (router/dispatch.py), so that the clients' streams get a turn
    under a flood.
 4. Having found the socket empty, it marks the clock caught up: every heartbeat that came before
    then is noted. A silence is measured up to that mark, never up to "now": a thread that was
    not scheduled, or that stopped reading because the loop is MAX_QUEUED messages behind (ZeroMQ
    holds the rest, as it did before), judges no worker until it has caught up again.
 5. Each pass rewrites the router's progress record (splitserve/progress.py) with when this
    thread and the event loop (loop_ran, by the liveness monitor) last ran: the launcher replaces
    a router that stopped, as it does a worker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from splitserve.progress import ProgressRecord
from splitserve.protocol import Heartbeat, Ready
from splitserve.security import process_name
from splitserve.transport import Receiver

log = logging.getLogger(__name__)

READ_BATCH = 256  # worker messages handled per pass of the event loop
MAX_QUEUED = 100_000  # messages read but not yet handled, past which the thread stops reading
POLL_MS = 50
# a pass of the thread that comes this long after the previous one follows a stall of the
# process: ZeroMQ's own I/O thread may not have moved what arrived meanwhile into the socket yet,
# so an empty socket is taken as caught up only on the next pass
STALL_S = 0.25
INCARNATIONS_KEPT = 4  # per worker: a restart, or a forger on an unauthenticated transport

Key = tuple[str, int]


class HeartbeatClock:
    """When the latest Ready or Heartbeat of each worker (role, index) and incarnation arrived,
    and up to when the inbox has seen everything that arrived. Written by the inbox thread,
    read by the loop: single assignments and reads of Python objects, safe under the GIL."""

    def __init__(self) -> None:
        self._arrivals: dict[Key, dict[str, float]] = {}
        self._caught_up: float | None = None  # None: no inbox reads for it (tests drive it)

    def heard(self, key: Key, incarnation: str, at: float) -> None:
        seen = self._arrivals.get(key)
        if seen is None:
            seen = self._arrivals[key] = {}
        if at > seen.get(incarnation, -1.0):
            seen[incarnation] = at
        if len(seen) > INCARNATIONS_KEPT:
            del seen[min(seen, key=seen.__getitem__)]

    def caught_up(self, at: float) -> None:
        self._caught_up = at

    def silent_for(self, key: Key, incarnation: str) -> float:
        """How long worker `key`, at this incarnation, had been silent when the inbox last had
        read everything that arrived (0 when it has not been heard from yet)."""
        at = self._arrivals.get(key, {}).get(incarnation)
        if at is None:
            return 0.0
        judged = self._caught_up if self._caught_up is not None else time.monotonic()
        return max(0.0, judged - at)


class Inbox:
    """The thread that reads `receiver` (it alone touches that socket once started) and hands
    each message to on_message(message, sender's authenticated name or None) on `loop`."""

    def __init__(
        self, receiver: Receiver, clock: HeartbeatClock, max_queued: int = MAX_QUEUED,
        progress: ProgressRecord | None = None,
    ):  # fmt: skip
        self.receiver = receiver
        self.clock = clock
        self.max_queued = max_queued
        self.progress = progress  # this process's record, rewritten each pass (step 5)
        self.loop_at = time.monotonic()  # when the event loop last said it ran (loop_ran)
        self._queue: deque[tuple[Any, str | None]] = deque()
        self._wake_pending = False
        self._room = threading.Event()  # set while the queue has room for more
        self._room.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_message: Callable[[Any, str | None], None] | None = None
        self.emptied_at = time.monotonic()  # when the loop last handled all there was

    def start(
        self, loop: asyncio.AbstractEventLoop, on_message: Callable[[Any, str | None], None]
    ) -> None:
        self._loop = loop
        self._on_message = on_message
        self._thread = threading.Thread(target=self._read, name="router-inbox", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading (the receiver may be closed afterwards)."""
        self._stop.set()
        self._room.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    def loop_ran(self) -> None:
        """The event loop ran (for the progress record)."""
        self.loop_at = time.monotonic()

    def paused(self) -> bool:
        """The thread stopped reading: the loop is max_queued messages behind."""
        return not self._room.is_set()

    def backlog(self) -> int:
        """Messages read and not yet handled."""
        return len(self._queue)

    # ---- the thread ----
    def _read(self) -> None:
        last_pass = time.monotonic()
        while not self._stop.is_set():
            if self.progress is not None:
                self.progress.write(time.monotonic(), self.loop_at)
            if not self._room.wait(timeout=POLL_MS / 1000):
                continue  # the loop is far behind: leave the rest in ZeroMQ's queue
            self.receiver.poll(POLL_MS)
            now = time.monotonic()
            stalled = now - last_pass > STALL_S
            last_pass = now
            try:
                received = self.receiver.drain_from(READ_BATCH)
            except Exception:  # a closed socket at shutdown; anything else must not end reading
                if self._stop.is_set():
                    return
                log.exception("router inbox: reading failed")
                continue
            for msg, _, peer in received:
                if isinstance(msg, Ready | Heartbeat) and (
                    peer is None or peer == process_name(msg.role, msg.index)
                ):
                    self.clock.heard((msg.role, msg.index), msg.incarnation, now)
                self._queue.append((msg, peer))
            if len(received) < READ_BATCH and not stalled:
                self.clock.caught_up(now)
            if len(self._queue) >= self.max_queued:
                self._room.clear()
            if received and not self._wake_pending:
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop closed: the router is stopping
                    return

    # ---- the event loop ----
    def _deliver(self) -> None:
        self._wake_pending = False
        queue = self._queue
        for _ in range(min(READ_BATCH, len(queue))):
            msg, peer = queue.popleft()
            try:
                self._on_message(msg, peer)
            except Exception:  # a bug must not stop the router from reading its workers
                log.exception("router: failed to handle %s", type(msg).__name__)
        if queue:
            self._wake_pending = True
            self._loop.call_soon(self._deliver)
        else:
            self.emptied_at = time.monotonic()
        if len(queue) < self.max_queued // 2:
            self._room.set()
