"""The router's view of its workers: who is ready, who is alive, and their load figures.

A worker is ready after a Ready (or a heartbeat naming this protocol version, for a router that
restarted after its workers) and dead after liveness_timeout_s without a heartbeat, as the inbox's
thread saw them arrive (router/inbox.py: a heartbeat that waited for a busy event loop is no
silence). Each run of a worker has its own random incarnation, in its Ready and every heartbeat: a
Ready of a new incarnation for a known role and index means the worker restarted, and everything
that depended on it is lost. A heartbeat of another incarnation than a live worker's is ignored: it
is no restart (a forged one used to end, and would now move, every stream of the worker). A restart
whose Ready was lost is seen once the old incarnation's heartbeats stop (it dies, then the new
incarnation's heartbeats make it ready). With CURVE, dispatch has already checked that the message
came from that worker's own key.

The prefill and decode workers are the cluster file's; the detok pool may grow while serving: a
detok worker of a new index joins when it reports Ready (its endpoint in the Ready), and one
that drains (stopping) leaves the pool's ring at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from router.inbox import HeartbeatClock
from splitserve.config import Addresses
from splitserve.protocol import (
    PROTOCOL_VERSION,
    DecodeLoad,
    DetokLoad,
    Heartbeat,
    PrefillLoad,
    Ready,
    TransportCounters,
    WorkerInfo,
)

log = logging.getLogger(__name__)


@dataclass
class WorkerState:
    role: str
    index: int
    state: str = "starting"  # starting | ready | dead | refused
    pid: int = 0
    last_seen: float = 0.0
    info: WorkerInfo = field(default_factory=WorkerInfo)
    heartbeat: Heartbeat | None = None  # the latest
    restarts: int = 0
    removed: bool = False  # a detok worker the operator took out of the pool (it may still run)
    incarnation: str = ""  # of the run the router knows (protocol.Ready)
    foreign: int = 0  # heartbeats of another incarnation, ignored
    foreign_logged_at: float = -float("inf")

    @property
    def load(self) -> PrefillLoad | DecodeLoad | DetokLoad | None:
        """The role's load report from the latest heartbeat (None before the first)."""
        beat = self.heartbeat
        return None if beat is None else getattr(beat, self.role)

    @property
    def transport(self) -> TransportCounters:
        return self.heartbeat.transport if self.heartbeat else TransportCounters()

    @property
    def key(self) -> tuple[str, int]:
        return (self.role, self.index)

    @property
    def live(self) -> bool:
        """Ready, and not draining: new work may go to it."""
        beat = self.heartbeat
        return (
            self.state == "ready" and not self.removed and not (beat is not None and beat.draining)
        )

    def summary(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "index": self.index,
            "state": self.state,
            "pid": self.pid,
            "seconds_since_heartbeat": round(time.monotonic() - self.last_seen, 3)
            if self.last_seen
            else None,
            "restarts": self.restarts,
            "draining": bool(self.heartbeat and self.heartbeat.draining),
            "removed": self.removed,
        }


MAX_DETOK_WORKERS = 256  # the most the detok pool may grow to
FOREIGN_LOG_S = 10.0  # ignored heartbeats are logged at most this often per worker


class WorkerTable:
    def __init__(
        self, addresses: Addresses, liveness_timeout_s: float, clock: HeartbeatClock | None = None,
        decode_slots: Sequence[int] = (),
    ):  # fmt: skip
        """decode_slots: each decode worker's slots as configured (0: "auto", settled by the
        worker from its model)."""
        self.liveness_timeout_s = liveness_timeout_s
        self.configured_slots = list(decode_slots)
        self.clock = clock if clock is not None else HeartbeatClock()
        self.workers: dict[tuple[str, int], WorkerState] = {}
        for role in ("prefill", "decode", "detok"):
            for i, endpoint in enumerate(addresses.of(role)):
                self.workers[(role, i)] = WorkerState(role, i, info=WorkerInfo(endpoint=endpoint))
        self.ever_ready = False  # a full pipeline was ready once: a gap now is a replacement

    def get(self, role: str, index: int) -> WorkerState | None:
        return self.workers.get((role, index))

    def of(self, role: str) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.role == role]

    def live(self, role: str) -> list[int]:
        """The indices of the role's workers that may take new work."""
        return [w.index for w in self.workers.values() if w.role == role and w.live]

    def observe(self, msg: Ready | Heartbeat) -> tuple[WorkerState | None, bool]:
        """Record a Ready or Heartbeat. Returns (worker, lost): lost if a ready worker restarted."""
        w = self.workers.get((msg.role, msg.index))
        if w is not None and w.removed and isinstance(msg, Ready):
            if msg.incarnation != w.incarnation:
                w.removed = False  # started again: the operator grew the pool back
        if w is None and msg.role == "detok" and isinstance(msg, Ready):
            if 0 <= msg.index < MAX_DETOK_WORKERS and msg.info.endpoint:
                w = self.workers[(msg.role, msg.index)] = WorkerState(msg.role, msg.index)
                log.info("detok[%d] joins the pool at %s", msg.index, msg.info.endpoint)
        if w is None:
            log.warning("message from unknown worker %s[%s]", msg.role, msg.index)
            return None, False
        version = msg.protocol_version
        if version != PROTOCOL_VERSION:
            if w.state != "refused":
                log.error(
                    "%s[%d] speaks protocol %s, router speaks %d: refused",
                    msg.role,
                    msg.index,
                    version,
                    PROTOCOL_VERSION,
                )
            w.state = "refused"
            return w, False
        lost = False
        if msg.incarnation != w.incarnation:
            if isinstance(msg, Heartbeat) and w.state == "ready" and w.incarnation:
                self._ignore_foreign(w, msg)
                return None, False
            restarted = bool(w.incarnation)  # a run before this one said Ready
            lost = restarted and w.state == "ready"  # what it held is gone (else lost at its death)
            if restarted:
                w.restarts += 1
                log.warning("%s[%d] restarted (pid %d -> %d)", w.role, w.index, w.pid, msg.pid)
            w.incarnation = msg.incarnation
        if w.state != "ready":
            log.info("%s[%d] ready (pid %d)", w.role, w.index, msg.pid)
        w.state = "ready"
        w.pid = msg.pid
        w.last_seen = time.monotonic()
        if isinstance(msg, Ready):
            w.info = msg.info if msg.info.endpoint else replace(msg.info, endpoint=w.info.endpoint)
        else:
            w.heartbeat = msg
        return w, lost

    @staticmethod
    def _ignore_foreign(w: WorkerState, msg: Heartbeat) -> None:
        w.foreign += 1
        now = time.monotonic()
        if now - w.foreign_logged_at >= FOREIGN_LOG_S:
            w.foreign_logged_at = now
            log.warning("%s[%d]: ignored a heartbeat of another incarnation (pid %d; %d in all): "
                        "not the worker that said Ready", w.role, w.index, msg.pid, w.foreign)

    def expire(self) -> list[WorkerState]:
        """Mark silent workers dead; returns those that just died."""
        died = []
        for w in self.workers.values():
            silent = self.clock.silent_for(w.key, w.incarnation)
            if w.state == "ready" and silent > self.liveness_timeout_s:
                w.state = "dead"
                died.append(w)
                log.error("%s[%d] missed heartbeats: dead", w.role, w.index)
        return died

    def reported_slots(self, decode_index: int) -> int:
        """The slots decode worker `decode_index` reported in its latest Ready (0: none yet)."""
        w = self.workers.get(("decode", decode_index))
        return w.info.num_slots if w is not None else 0

    def decode_slots(self, index: int) -> int:
        """Decode worker `index`'s slots: what its Ready reported (num_slots "auto" is settled
        from its model), else as configured (0 for "auto" before it reports)."""
        configured = self.configured_slots
        return self.reported_slots(index) or (configured[index] if index < len(configured) else 0)

    def total_decode_slots(self) -> int:
        return sum(self.decode_slots(d) for d in range(len(self.configured_slots)))

    def timings(self) -> tuple[float, float]:
        """(median prefill, median decode step gap) in seconds from the latest heartbeats."""
        prefill = step = 0.0
        for w in self.workers.values():
            load = w.load
            if isinstance(load, PrefillLoad):
                prefill = max(prefill, load.prefill_time.p50)
            elif isinstance(load, DecodeLoad):
                step = max(step, load.step_gap.p50)
        return prefill, step

    def live_detoks(self) -> list[int]:
        return self.live("detok")

    def pipeline_ready(self) -> bool:
        """At least one live worker of every role: a request can be placed."""
        ready = all(self.live(role) for role in ("prefill", "decode", "detok"))
        self.ever_ready = self.ever_ready or ready
        return ready

    def resize_detok_pool(self, count: int) -> None:
        """The operator wants detok workers 0..count-1: those past it leave the ring (removed)."""
        for w in self.of("detok"):
            w.removed = w.index >= count

    def detok_pool(self, requests: Iterable[Any]) -> list[dict[str, Any]]:
        """Each detok worker's state as the operator sees it, with the streams of `requests`
        (request handles) placed on it."""
        streams: dict[int, int] = {}
        for handle in requests:
            if handle.placed:
                streams[handle.stamp.detok] = streams.get(handle.stamp.detok, 0) + 1
        return [
            {"index": w.index, "state": w.state, "removed": w.removed, "live": w.live,
             "streams": streams.get(w.index, 0)}
            for w in sorted(self.of("detok"), key=lambda w: w.index)
        ]  # fmt: skip

    def detok_endpoints(self) -> list[str]:
        """The detok pool as DetokPool announces it: each index's endpoint, "" where none."""
        detoks = {w.index: w for w in self.of("detok")}
        size = max(detoks, default=-1) + 1
        return [detoks[k].info.endpoint if k in detoks else "" for k in range(size)]

    def summary(self) -> list[dict[str, Any]]:
        return [w.summary() for w in self.workers.values()]
