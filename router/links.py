"""The router's sockets: its bound receiver, a sender to every worker, and batched aborts.

The senders are the workers' own type (splitserve.transport.Sender): sends never block, and a
send to a slow or gone worker is dropped and counted. The receiver is read by a reader on the
socket's descriptor (no future per message, as zmq.asyncio's recv would cost); see start_reading.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import zmq

from splitserve.config import Addresses
from splitserve.protocol import Abort, TransportCounters
from splitserve.transport import Receiver, Sender

log = logging.getLogger(__name__)

READ_BATCH = 256  # worker messages handled per pass of the event loop


class WorkerLinks:
    def __init__(
        self, ctx: zmq.Context, addresses: Addresses, counters: TransportCounters,
        max_message_bytes: int = -1,
    ):  # fmt: skip
        self.counters = counters
        self.receiver = Receiver(ctx, addresses.router, counters, max_message_bytes)
        self.prefill = Sender(ctx, addresses.prefill, counters)
        self.decode = Sender(ctx, addresses.decode, counters)
        self.detoks = [Sender(ctx, addr, counters) for addr in addresses.detok]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_message: Callable[[Any], None] | None = None
        self._pending_aborts: dict[str, int] = {}  # request id -> its detok worker

    # ---- receiving ----
    def start_reading(self, on_message: Callable[[Any], None]) -> None:
        """Hand every message that arrives to on_message, on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._on_message = on_message
        self._loop.add_reader(self.receiver.socket.getsockopt(zmq.FD), self._on_readable)
        self._loop.call_soon(self._on_readable)  # whatever came before the reader was added

    def _on_readable(self) -> None:
        """Dispatch the messages waiting, up to READ_BATCH, then again on the next pass of the
        event loop while more wait, so that the clients' streams get a turn under a flood.

        The descriptor only says that the socket's state may have changed; reading until no
        message waits (Receiver.pending) is what re-arms it.
        """
        for msg, _ in self.receiver.drain(READ_BATCH):
            try:
                self._on_message(msg)
            except Exception:  # a bug must not stop the router from reading its workers
                log.exception("router: failed to handle %s", type(msg).__name__)
        if self.receiver.pending():
            self._loop.call_soon(self._on_readable)

    # ---- aborts ----
    def abort_soon(self, request_id: str, detok_index: int) -> None:
        """Aborts are batched: one Abort message per worker per event-loop turn."""
        if not self._pending_aborts:
            asyncio.get_running_loop().call_soon(self.flush_aborts)
        self._pending_aborts[request_id] = detok_index

    def flush_aborts(self) -> None:
        if not self._pending_aborts:
            return
        aborts, self._pending_aborts = self._pending_aborts, {}
        rids = list(aborts)
        self.prefill.send(Abort(rids))
        self.decode.send(Abort(rids))
        by_detok: dict[int, list[str]] = {}
        for rid, k in aborts.items():
            by_detok.setdefault(k, []).append(rid)
        for k, ids in by_detok.items():
            self.detoks[k].send(Abort(ids))

    def close(self) -> None:
        receiver = self.receiver
        if not receiver.socket.closed:
            if self._loop is not None:
                self._loop.remove_reader(receiver.socket.getsockopt(zmq.FD))
            receiver.close()
        for s in (self.prefill, self.decode, *self.detoks):
            s.close()
