"""The router's view of its workers: who is ready, who is alive, and their load figures.

A worker is ready after a Ready (or a heartbeat naming this protocol version, for a router that
restarted after its workers) and dead after liveness_timeout_s without a heartbeat. A new pid for a
known role and index means the worker restarted: everything that depended on it is lost.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

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
        }


class WorkerTable:
    def __init__(self, detok_count: int, liveness_timeout_s: float):
        self.liveness_timeout_s = liveness_timeout_s
        self.workers: dict[tuple[str, int], WorkerState] = {}
        for role, count in (("prefill", 1), ("decode", 1), ("detok", detok_count)):
            for i in range(count):
                self.workers[(role, i)] = WorkerState(role, i)

    def get(self, role: str, index: int) -> WorkerState | None:
        return self.workers.get((role, index))

    def observe(self, msg: Ready | Heartbeat) -> tuple[WorkerState | None, bool]:
        """Record a Ready or Heartbeat. Returns (worker, lost): lost if a ready worker restarted."""
        w = self.workers.get((msg.role, msg.index))
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
        lost = w.state == "ready" and w.pid != msg.pid
        if lost:
            w.restarts += 1
            log.warning("%s[%d] restarted (pid %d -> %d)", w.role, w.index, w.pid, msg.pid)
        if w.state != "ready":
            log.info("%s[%d] ready (pid %d)", w.role, w.index, msg.pid)
        w.state = "ready"
        w.pid = msg.pid
        w.last_seen = time.monotonic()
        if isinstance(msg, Ready):
            w.info = msg.info
        else:
            w.heartbeat = msg
        return w, lost

    def expire(self) -> list[WorkerState]:
        """Mark silent workers dead; returns those that just died."""
        now = time.monotonic()
        died = []
        for w in self.workers.values():
            if w.state == "ready" and now - w.last_seen > self.liveness_timeout_s:
                w.state = "dead"
                died.append(w)
                log.error("%s[%d] missed heartbeats: dead", w.role, w.index)
        return died

    def live_detoks(self) -> list[int]:
        return [w.index for w in self.workers.values() if w.role == "detok" and w.state == "ready"]

    def pipeline_ready(self) -> bool:
        return (
            self.workers[("prefill", 0)].state == "ready"
            and self.workers[("decode", 0)].state == "ready"
            and bool(self.live_detoks())
        )

    def summary(self) -> list[dict[str, Any]]:
        return [w.summary() for w in self.workers.values()]
