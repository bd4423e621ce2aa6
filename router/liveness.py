"""Worker liveness and request deadlines: the router's monitor.

Every MONITOR_INTERVAL_S it marks workers dead whose heartbeats stopped (a worker that restarted is
seen by its new pid as heartbeats arrive, see WorkerTable.observe) and has the requests that
depended on a lost worker moved (router/migration.py); it also ends requests past their deadline,
and those that made no progress for stall_timeout_s (the backstop for a message lost in a crash).
A request still waiting for its first token is lost once its prefill worker was seen idle
stall_timeout_s after the request was sent to it (see PrefillIdle): a prefill queue, however
long, is never a stall.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from router.request_table import RequestTable
from router.requests import RequestHandle
from router.workers import WorkerState, WorkerTable
from splitserve.protocol import DecodeLoad, FinishReason, Heartbeat

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
        heartbeat_interval_s: float,
    ):
        self.workers = workers
        self.requests = requests
        self.stall_timeout_s = stall_timeout_s
        self.end = end
        self.worker_lost = worker_lost
        self.on_workers_changed = on_workers_changed
        self.heartbeat_interval_s = heartbeat_interval_s
        self.prefill_idle: dict[int, PrefillIdle] = {}  # per prefill worker

    def _prefill_idle(self, index: int) -> PrefillIdle:
        idle = self.prefill_idle.get(index)
        if idle is None:
            idle = self.prefill_idle[index] = PrefillIdle(self.heartbeat_interval_s)
        return idle

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
        no output for stall_timeout_s. A request still queued at the prefill worker (new, or moved
        and sent to be prefilled again), or (while the
        decode worker has prefixes waiting) still waiting for a decode slot, is not lost: only its
        overall deadline and the liveness of its workers bound it."""
        now = time.monotonic()
        stall = self.stall_timeout_s
        contended = {
            w.index for w in self.workers.of("decode")
            if isinstance(w.load, DecodeLoad) and w.load.pending > 0
        }  # fmt: skip
        idle_at = {
            w.index: self._prefill_idle(w.index).observe(w) for w in self.workers.of("prefill")
        }
        for handle in self.requests.handles():
            if now > handle.deadline:
                self.end(handle, FinishReason.ERROR, "request timed out")
            elif handle.waiting_since is not None:
                continue  # a move waits for a live worker: bounded by migration_timeout_s
            elif handle.completion_tokens == handle.prefill_from:  # its prefill's token not in
                idle = idle_at.get(handle.stamp.prefill)
                if idle is not None and idle - handle.last_progress > stall:
                    self.end(handle, FinishReason.ERROR, "no first token: the prefill worker"
                             f" went idle {stall:.0f} s after the request was sent (lost)")
            elif handle.completion_tokens <= 1 and handle.stamp.decode in contended:
                continue
            elif now - handle.last_progress > stall:
                self.end(handle, FinishReason.ERROR, f"no progress for {stall:.0f} s")


class PrefillIdle:
    """When the prefill worker was last seen idle: every request that had reached it was done.

    A heartbeat carries the load snapshot of the worker's last completed loop pass, taken
    loop_age_s before it was sent, and snapshots are at least half a heartbeat interval apart. A
    pass drains the socket, then runs at most one prefill. So when a snapshot shows an empty queue
    and the same prefill count as an earlier, distinct snapshot, its pass ran no prefill and its
    drain was just before it: every request in the socket by then was prefilled, failed or
    aborted. A request sent stall_timeout_s before that and still without a first token was lost
    on the way (a dropped message, a crash between two sends). During a long prefill the worker
    takes no snapshot (the heartbeats repeat the last one), so a busy worker never reads idle.
    """

    def __init__(self, heartbeat_interval_s: float) -> None:
        # snapshot times estimated closer than this are one snapshot seen twice (transit jitter)
        self.same_snapshot_s = heartbeat_interval_s / 4
        self._beat: Heartbeat | None = None
        self._reference: tuple[int, float, int] | None = None  # pid, taken, prefills
        self.idle_at: float | None = None  # router clock, when the idle snapshot was taken

    def observe(self, worker: WorkerState | None) -> float | None:
        beat = worker.heartbeat if worker is not None else None
        if beat is None or beat is self._beat or beat.prefill is None:
            return self.idle_at
        self._beat = beat
        taken = worker.last_seen - beat.loop_age_s
        load, ref = beat.prefill, self._reference
        if ref is None or ref[0] != beat.pid:  # a new worker: nothing known of it yet
            self.idle_at = None
        elif taken - ref[1] < self.same_snapshot_s:
            return self.idle_at  # the reference snapshot again
        elif load.queue == 0 and load.prefills == ref[2]:
            self.idle_at = taken
        self._reference = (beat.pid, taken, load.prefills)
        return self.idle_at
