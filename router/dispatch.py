"""What the workers send the router, each message type to its handler.

- TextBatch (detok workers): each delta goes to its request's handle if it is of the request's
  current placement epoch and starts where the client's text has got to (so no delta is ever
  delivered twice, whatever a dead or woken worker sends); a delta that carries a finish reason
  ends the request. Late output of a request that already ended is dropped.
- Ready / Heartbeat (every worker): the worker table learns who is ready, alive and how loaded;
  a worker seen with a new pid restarted, and what depended on it is lost.
- RequestFailed (any worker): those requests (at their current epoch) end with an error that
  names the worker's reason.

With CURVE, each message comes with its sender's authenticated process name (`detok-1`): a
Ready or Heartbeat counts only from the worker it names, a delta only from the detok worker the
request is placed on, a failure only from the request's worker of that role; anything else is
counted as forged and dropped. Without it (ipc, inproc) the sockets' permissions are the boundary.

Dispatch delivers deltas to their handles itself; what the router must do beyond that (end a
request, move what a lost worker held, follow a change of the workers, let waiters in) it returns
as decisions (router/decisions.py) for the router core to act on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from router.decisions import PROGRESSED, Decision, End, Lost, WorkersChanged
from router.metrics import RouterMetrics
from router.placement import Placement
from router.request_table import RequestTable
from router.requests import Delta
from router.workers import WorkerTable
from splitserve.protocol import (
    FinishReason,
    Heartbeat,
    Ready,
    RequestFailed,
    TextBatch,
    TransportCounters,
)
from splitserve.security import parse_process_name, process_name

log = logging.getLogger(__name__)

Handler = Callable[[Any, str | None], list[Decision]]


class MessageDispatch:
    def __init__(
        self,
        requests: RequestTable,
        workers: WorkerTable,
        placement: Placement,
        metrics: RouterMetrics,
        counters: TransportCounters,
    ):
        self.requests = requests
        self.workers = workers
        self.placement = placement
        self.metrics = metrics
        self.counters = counters
        self.stale_deltas = 0  # of an older epoch, or not where the client's text is
        self.forged = 0  # from an authenticated process that is not the one the message names
        self.handlers: dict[type, Handler] = {
            TextBatch: self.text_batch,
            Ready: self.worker_status,
            Heartbeat: self.worker_status,
            RequestFailed: self.request_failed,
        }

    def __call__(self, msg: Any, peer: str | None = None) -> list[Decision]:
        """peer: the sender's authenticated process name (CURVE), or None."""
        handler = self.handlers.get(type(msg))
        if handler is None:
            self.counters.malformed += 1
            log.warning("router: unexpected %s", type(msg).__name__)
            return []
        return handler(msg, peer)

    def _forged(self, msg: Any, peer: str, what: str) -> None:
        self.forged += 1
        self.counters.malformed += 1
        log.warning("router: dropped a %s from %s: %s", type(msg).__name__, peer, what)

    def text_batch(self, msg: TextBatch, peer: str | None = None) -> list[Decision]:
        now = time.monotonic()
        sender = parse_process_name(peer) if peer is not None else None
        if peer is not None and (sender is None or sender[0] != "detok"):
            self._forged(msg, peer, "text comes from detok workers")
            return []
        out: list[Decision] = []
        ended: set[str] = set()  # by a delta of this batch: later ones are late output
        for d in msg.deltas:
            handle = self.requests.get(d.request_id)
            if handle is None or d.request_id in ended:
                continue  # already ended here (aborted, failed): late output is dropped
            if sender is not None and handle.stamp.detok != sender[1]:
                # not its detok worker now: one it was moved away from (late), or a forgery
                self.stale_deltas += 1
                continue
            if d.epoch != handle.epoch or d.start_seq != handle.completion_tokens:
                self.stale_deltas += 1
                continue
            self.placement.prefilled(handle)
            previous = handle.first_token_at and handle.last_progress
            handle.push(Delta(d.text, d.token_ids, d.logprobs, d.top_ids, d.top_logprobs,
                              d.prompt_logprobs, d.cached_tokens))  # fmt: skip
            self.metrics.delta(handle, len(d.token_ids), now, previous)
            if d.finish_reason:
                ended.add(d.request_id)
                out.append(End(handle, d.finish_reason))
        out.append(PROGRESSED)
        return out

    def worker_status(self, msg: Ready | Heartbeat, peer: str | None = None) -> list[Decision]:
        if peer is not None and peer != process_name(msg.role, msg.index):
            self._forged(msg, peer, f"it names {msg.role}[{msg.index}]")
            return []
        worker, lost = self.workers.observe(msg)
        changed = WorkersChanged(worker if isinstance(msg, Ready) else None)
        return [Lost(worker), changed] if worker is not None and lost else [changed]

    def request_failed(self, msg: RequestFailed, peer: str | None = None) -> list[Decision]:
        sender = parse_process_name(peer) if peer is not None else None
        if peer is not None and (sender is None or sender[0] != msg.role):
            self._forged(msg, peer, f"it names the {msg.role} role")
            return []
        out: list[Decision] = []
        for rid, epoch in zip(msg.request_ids, msg.epochs, strict=False):
            handle = self.requests.get(rid)
            if handle is None or handle.epoch != epoch:
                continue
            if sender is not None and getattr(handle.stamp, msg.role) != sender[1]:
                continue  # a worker it was moved away from (late), or a forgery: not its own
            out.append(End(handle, FinishReason.ERROR, f"{msg.role}: {msg.message}"))
        return out
