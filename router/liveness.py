"""Worker liveness and request deadlines: the router's monitor.

Every MONITOR_INTERVAL_S it marks workers dead whose heartbeats stopped, as the inbox's thread saw
them arrive (router/inbox.py; a worker that restarted is seen by its new incarnation as heartbeats
arrive, see WorkerTable.observe), for the requests that depended on a lost worker to be moved
(router/migration.py); it also ends requests past their deadline, and those that made no progress
for stall_timeout_s (the backstop for a message lost in a crash) unless the event loop is behind
with the workers' messages (their progress may be among them).
A request still waiting for its first token is lost once its prefill worker has shown that the
request left it (see prefill_cleared) and stall_timeout_s more passed: a prefill queue, however
long, is never a stall, and a heartbeat delayed in a busy router is no evidence either way.
The monitor decides and the router core acts (router/decisions.py): each pass yields the workers
lost, then, once the core has moved their requests, the requests to end and the workers to fence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from router.decisions import Decision, End, Fence, Lost, WorkersChanged
from router.inbox import Inbox
from router.request_table import RequestTable
from router.requests import RequestHandle
from router.workers import WorkerState, WorkerTable
from splitserve.protocol import DecodeLoad, FinishReason, PrefillLoad

MONITOR_INTERVAL_S = 0.1
# the loop has had workers' messages waiting, unhandled, for this long: it is behind
BEHIND_S = 1.0


class LivenessMonitor:
    def __init__(self, workers: WorkerTable, requests: RequestTable, stall_timeout_s: float):
        self.workers = workers
        self.requests = requests
        self.stall_timeout_s = stall_timeout_s
        self.fenced_at: dict[int, float] = {}  # prefill worker -> when it was last sent a Fence

    async def passes(self, inbox: Inbox) -> AsyncIterator[list[Decision]]:
        """The monitor's passes, every MONITOR_INTERVAL_S, each as two lists of decisions: the
        workers that died (and a look at every worker's state), then, computed once the core has
        acted on those, the requests that end and the prefill workers to fence."""
        while True:
            await asyncio.sleep(MONITOR_INTERVAL_S)
            inbox.loop_ran()
            yield [*(Lost(w) for w in self.workers.expire()), WorkersChanged()]
            now = time.monotonic()
            behind = inbox.backlog() > 0 and now - inbox.emptied_at > BEHIND_S
            yield self.expire_requests(now, stalls=not behind)
            self.requests.prune()

    def expire_requests(self, now: float | None = None, stalls: bool = True) -> list[Decision]:
        """The backstop for requests lost without a worker dying (a message lost in a crash):
        no output for stall_timeout_s. A request still queued at the prefill worker (new, or
        moved and sent to be prefilled again), or (while prefixes wait for its decode worker,
        there or in a prefill worker's outbox) still waiting for a decode slot, is not lost: only
        its overall deadline and the liveness of its workers bound it. `now`: the monotonic time
        of this pass (the current one when not given). stalls=False: only deadlines end requests
        (the loop is behind with the workers' messages, which may hold the progress of those that
        look stalled). Returns the requests to end, then the prefill workers to fence."""
        now = time.monotonic() if now is None else now
        out: list[Decision] = []
        stall = self.stall_timeout_s
        contended = {
            w.index for w in self.workers.of("decode")
            if isinstance(w.load, DecodeLoad) and w.load.pending > 0
        } | outboxes_waiting(self.workers)  # fmt: skip
        cleared = {w.index: prefill_cleared(w) for w in self.workers.of("prefill")}
        unproven: set[int] = set()  # prefill workers owing proof for a request past its stall
        for handle in self.requests.handles():
            if now > handle.deadline:
                out.append(End(handle, FinishReason.ERROR, "request timed out"))
            elif not stalls:
                continue
            elif handle.waiting_since is not None:
                continue  # a move waits for a live worker: bounded by migration_timeout_s
            elif handle.completion_tokens == handle.prefill_from:  # its prefill's token not in
                out += self._first_token_bound(handle, cleared.get(handle.stamp.prefill), now,
                                               unproven)  # fmt: skip
            elif (handle.completion_tokens <= handle.prefill_from + 1
                  and handle.stamp.decode in contended):  # its prefix may be one that waits
                continue
            elif now - handle.last_progress > stall:
                out.append(End(handle, FinishReason.ERROR, f"no progress for {stall:.0f} s"))
        for index in unproven:
            if now - self.fenced_at.get(index, -stall) > stall:
                self.fenced_at[index] = now
                out.append(Fence(index))
        return out

    def _first_token_bound(
        self, handle: RequestHandle, cleared: int | None, now: float, unproven: set[int]
    ) -> list[Decision]:
        """A request without its first token: once its prefill worker showed that the request
        left it, its token has stall_timeout_s to arrive. Without that proof it waits on (its
        deadline bounds it); past a stall its worker is fenced, so that a request lost as the
        last message sent is proven gone too."""
        stall = self.stall_timeout_s
        if cleared is not None and cleared >= handle.prefill_seq:
            if handle.prefill_cleared_at is None:
                handle.prefill_cleared_at = now
            elif now - handle.prefill_cleared_at > stall:
                return [End(handle, FinishReason.ERROR, "no first token: the request left the"
                            f" prefill worker and its token did not come in {stall:.0f} s (lost)")]
        elif now - handle.last_progress > stall:
            unproven.add(handle.stamp.prefill)
        return []


def outboxes_waiting(workers: WorkerTable) -> set[int]:
    """The decode workers for which a prefill worker that is alive (draining ones too) holds
    prefixes their sockets did not take yet (PrefillLoad.outbox): such a prefix is on its way,
    not lost; a dead prefill worker's went with it."""
    return {
        d for w in workers.of("prefill") if w.state == "ready" and isinstance(w.load, PrefillLoad)
        for d, waiting in enumerate(w.load.outbox) if waiting
    }  # fmt: skip


def prefill_cleared(worker: WorkerState | None) -> int | None:
    """The highest send sequence number up to which prefill worker `worker` (its current
    incarnation) is proven done: its last snapshot shows an empty queue, so every request it had
    received by then, up to the last_seq it echoes, was prefilled, failed or aborted. One link's
    messages arrive in order, so a request with a seq at or below it either reached the worker
    or was lost on the way. The snapshot is taken between loop passes, never during a prefill;
    a heartbeat sent during one repeats the last snapshot, whose last_seq is older. None: no
    proof (no heartbeat of this incarnation yet, or requests still queued)."""
    beat = worker.heartbeat if worker is not None else None
    if beat is None or beat.incarnation != worker.incarnation:
        return None
    if beat.prefill is None or beat.prefill.queue > 0:
        return None
    return beat.prefill.last_seq
