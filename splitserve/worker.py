"""What every worker role shares: its receiver, its link to the router, Ready, heartbeats, drain.

A role subclasses WorkerLoop and provides warmup(), loop_once(), load() and idle(). The same class
runs as an OS process (python -m <role>) or as a thread (threads mode); only the zmq context and
the stop event come from outside.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import zmq

from splitserve.config import ClusterConfig
from splitserve.protocol import PROTOCOL_VERSION, Heartbeat, Ready
from splitserve.transport import Counters, Receiver, Sender

log = logging.getLogger(__name__)


class WorkerLoop:
    role = "worker"

    def __init__(self, config: ClusterConfig, index: int, ctx: zmq.Context, stop: threading.Event):
        self.config = config
        self.index = index
        self.ctx = ctx
        self.stop = stop
        self.counters = Counters()
        self.pid = os.getpid()
        self.receiver = Receiver(ctx, self.own_address(), self.counters)
        self.router = Sender(ctx, config.addresses.router, self.counters)
        self._next_heartbeat = 0.0

    # ---- provided by each role ----
    def own_address(self) -> str:
        raise NotImplementedError

    def warmup(self) -> dict[str, Any]:
        """Compile and prepare; returns facts for the Ready message."""
        return {}

    def loop_once(self) -> None:
        raise NotImplementedError

    def load(self) -> dict[str, Any]:
        return {}

    def idle(self) -> bool:
        """Nothing in flight: a draining worker may exit."""
        return True

    def close(self) -> None:
        pass

    # ---- shared ----
    def run(self) -> None:
        info = self.warmup()
        self.router.send(Ready(self.role, self.index, PROTOCOL_VERSION, self.pid, info))
        log.info("%s[%d] ready (pid %d)", self.role, self.index, self.pid)
        drain_deadline = None
        try:
            while True:
                if self.stop.is_set():
                    if drain_deadline is None:
                        drain_deadline = time.monotonic() + self.config.lifecycle.drain_timeout_s
                        log.info("%s[%d] draining", self.role, self.index)
                    if self.idle() or time.monotonic() > drain_deadline:
                        break
                self.loop_once()
                self.maybe_heartbeat()
        finally:
            self.close()
            self.receiver.close()
            self.router.close()
            log.info("%s[%d] stopped", self.role, self.index)

    def maybe_heartbeat(self) -> None:
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.config.lifecycle.heartbeat_interval_s
        load = self.load()
        load["transport"] = self.counters.as_dict()
        load["draining"] = self.stop.is_set()
        load["protocol_version"] = PROTOCOL_VERSION
        self.router.send(Heartbeat(self.role, self.index, self.pid, load))

    def poll_timeout_ms(self) -> int:
        """Block at most until the next heartbeat is due."""
        wait = self._next_heartbeat - time.monotonic()
        return max(0, min(50, int(wait * 1000)))
