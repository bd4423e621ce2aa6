"""The router's sockets: its bound receiver, a sender to every worker, batched aborts, and the
send sequence numbers of what goes to prefill workers (docs/protocol.md, "The first-token bound").

The senders are the workers' own type (splitserve.transport.Sender): sends never block, and a
send to a slow or gone worker is dropped and counted. The receiver is read by the inbox's thread
(router/inbox.py), which notes when heartbeats arrive; see start_reading.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from router.inbox import HeartbeatClock, Inbox
from router.placement import Stamp
from splitserve.config import WORKER_ROLES, Addresses
from splitserve.progress import ProgressRecord
from splitserve.protocol import Abort, DetokPool, Fence, TransportCounters
from splitserve.security import curve_client, curve_server
from splitserve.transport import Receiver, Sender

log = logging.getLogger(__name__)


class WorkerLinks:
    def __init__(
        self, ctx: zmq.Context, addresses: Addresses, counters: TransportCounters,
        max_message_bytes: int = -1, keys_dir: str = "", clock: HeartbeatClock | None = None,
        progress: ProgressRecord | None = None,
    ):  # fmt: skip
        """keys_dir: the cluster's CURVE keys ([security]): tcp links then use them. clock:
        where the inbox notes the arrival of heartbeats (the worker table judges by it).
        progress: the router's progress record, which the inbox's thread keeps."""
        self.ctx = ctx
        self.counters = counters
        self.keys_dir = keys_dir
        curve = curve_server(keys_dir, addresses.router, "router", 0)
        self.receiver = Receiver(ctx, addresses.router, counters, max_message_bytes, curve)
        self.inbox = Inbox(
            self.receiver, clock if clock is not None else HeartbeatClock(), progress=progress
        )
        self.senders: dict[tuple[str, int], Sender] = {}
        for role in WORKER_ROLES:
            for index, endpoint in enumerate(addresses.of(role)):
                self.connect(role, index, endpoint)
        # (role, index) -> [(request id, epoch)] to abort at the end of this event-loop turn
        self._pending_aborts: dict[tuple[str, int], list[tuple[str, int]]] = {}
        self.detok_pool: list[str] = []  # as last announced to prefill and decode workers
        # From the start time in microseconds: a restarted router numbers above its predecessor
        # (it sends far fewer than a message a microsecond), so no worker echoing an old number
        # is taken to have received a new request.
        self._seqs = itertools.count(int(time.time() * 1e6) + 1)

    def connect(self, role: str, index: int, endpoint: str) -> None:
        """A sender to worker (role, index) at endpoint (replacing one to another endpoint)."""
        old = self.senders.get((role, index))
        if old is not None:
            if old.endpoint == endpoint:
                return
            old.close()
        curve = curve_client(self.keys_dir, endpoint, ("router", 0), (role, index))
        self.senders[(role, index)] = Sender(self.ctx, endpoint, self.counters, curve)

    def send(self, role: str, index: int, msg: Any) -> bool:
        """Send without blocking; False when dropped (the worker is slow, gone or unknown)."""
        sender = self.senders.get((role, index))
        if sender is None:
            self.counters.dropped += 1
            return False
        return sender.send(msg)

    def broadcast(self, roles: tuple[str, ...], msg: Any) -> None:
        for (role, index) in list(self.senders):
            if role in roles:
                self.send(role, index, msg)

    def follow_detok_pool(self, pool: list[str], ready: Any = None) -> None:
        """The detok pool is `pool` (each index's endpoint, "" where none): when it changed,
        connect to its new members and tell every prefill and decode worker; else tell one
        that just said Ready (`ready`: its WorkerState) of it as it is."""
        if pool != self.detok_pool:
            for k, endpoint in enumerate(pool):
                if endpoint:
                    self.connect("detok", k, endpoint)
            self.detok_pool = pool
            self.broadcast(("prefill", "decode"), DetokPool(pool))
        elif ready is not None and ready.role in ("prefill", "decode"):
            self.send(ready.role, ready.index, DetokPool(pool))

    def next_seq(self) -> int:
        """The send sequence number for the next GenerateRequest or Fence to a prefill worker."""
        return next(self._seqs)

    def fence(self, index: int) -> None:
        """A Fence to prefill worker `index`: once its load echoes this number, everything sent
        to it before has arrived or was lost."""
        self.send("prefill", index, Fence(self.next_seq()))

    # ---- receiving ----
    def start_reading(self, on_message: Callable[[Any, str | None], None]) -> None:
        """Hand every message that arrives to on_message(message, its sender's authenticated
        name or None), on the running event loop."""
        self.inbox.start(asyncio.get_running_loop(), on_message)

    # ---- aborts ----
    def abort_soon(self, request_id: str, stamp: Stamp, roles=WORKER_ROLES) -> None:
        """Tell the request's workers (of these roles) to forget it at the stamp's epoch and
        before. Batched: one Abort message per worker per event-loop turn."""
        if not self._pending_aborts:
            asyncio.get_running_loop().call_soon(self.flush_aborts)
        where = {"prefill": stamp.prefill, "decode": stamp.decode, "detok": stamp.detok}
        for role in roles:
            self._pending_aborts.setdefault((role, where[role]), []).append(
                (request_id, stamp.epoch)
            )

    def flush_aborts(self) -> None:
        aborts, self._pending_aborts = self._pending_aborts, {}
        for (role, index), entries in aborts.items():
            rids, epochs = zip(*entries, strict=True)
            self.send(role, index, Abort(list(rids), list(epochs)))

    def close(self) -> None:
        self.inbox.stop()
        if not self.receiver.socket.closed:
            self.receiver.close()
        for s in self.senders.values():
            s.close()
