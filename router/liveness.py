"""Worker liveness and request deadlines: the router's monitor.

Every MONITOR_INTERVAL_S it marks workers dead whose heartbeats stopped (a worker that restarted is
seen by its new pid as heartbeats arrive, see WorkerTable.observe) and has the requests that
depended on a lost worker moved (router/migration.py); it also ends requests past their deadline,
and those that made no progress for stall_timeout_s (the backstop for a message lost in a crash).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from router.request_table import RequestTable
from router.requests import RequestHandle
from router.workers import WorkerState, WorkerTable
from splitserve.protocol import DecodeLoad, FinishReason

MONITOR_INTERVAL_S = 0.1

EndRequest = Callable[[RequestHandle, FinishReason, str], None]


class LivenessMonitor:
    def __init__(
        self,
        workers: WorkerTable,
        requests: RequestTable,
        stall_timeout_s: float,
        end: EndRequest,
        worker_lost: Callable[[WorkerState], None],
        on_workers_changed: Callable[[WorkerState | None], None],
    ):
        self.workers = workers
        self.requests = requests
        self.stall_timeout_s = stall_timeout_s
        self.end = end
        self.worker_lost = worker_lost
        self.on_workers_changed = on_workers_changed

    async def run(self) -> None:
        while True:
            await asyncio.sleep(MONITOR_INTERVAL_S)
            for w in self.workers.expire():
                self.worker_lost(w)
            self.on_workers_changed(None)
            self.expire_requests()
            self.requests.prune()

    def expire_requests(self) -> None:
        """The backstop for requests lost without a worker dying (a message lost in a crash):
        no output for stall_timeout_s. A request still queued at the prefill worker, or (while the
        decode worker has prefixes waiting) still waiting for a decode slot, is not lost: only its
        overall deadline and the liveness of its workers bound it."""
        now = time.monotonic()
        stall = self.stall_timeout_s
        contended = {
            w.index for w in self.workers.of("decode")
            if isinstance(w.load, DecodeLoad) and w.load.pending > 0
        }  # fmt: skip
        for handle in self.requests.handles():
            if now > handle.deadline:
                self.end(handle, FinishReason.ERROR, "request timed out")
            elif handle.first_token_at is None or handle.waiting_since is not None:
                continue
            elif handle.completion_tokens <= 1 and handle.stamp.decode in contended:
                continue
            elif now - handle.last_progress > stall:
                self.end(handle, FinishReason.ERROR, f"no progress for {stall:.0f} s")
