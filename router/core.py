"""The router core: a request's life from admission to its one end, composed of small parts.

A request's path through the router core:
 1. submit() checks the prompt and parameters against the one table of bounds and refuses
    max_tokens beyond the context, then builds and encodes the request's message, refused if it
    could not travel (router/params.py); only then is the request id reserved
    (router/request_table.py).
 2. Admission (router/admission.py) lets it into the pipeline at once, queues it, or refuses it
    (Overloaded / NotReady).
 3. Placement (router/placement.py) stamps its prefill, decode and detok workers and its
    placement epoch; the GenerateRequest goes to that prefill worker (router/links.py: the
    router's sockets).
 4. TextBatches from the detok workers reach the request's handle through the dispatch table
    (router/dispatch.py); the delta that carries a finish reason ends the request.
 5. A client that goes away calls abort(): prefill, decode and the detok worker are told to forget
    the request (batched per event-loop turn), and its admission place is released.
 6. The liveness monitor (router/liveness.py) marks workers dead when their heartbeats stop; every
    request that depended on a dead worker is moved to live ones at a new epoch, losing and
    repeating nothing (router/migration.py); requests that make no progress end in bounded time.
Every end goes through end(): exactly once per request. The liveness monitor, the migrator and the
dispatch of the workers' messages decide; act() carries out what they decide (router/decisions.py).
The HTTP layer (router.http) wraps this; tests drive it directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import zmq

from router.admission import AdmissionController
from router.decisions import (
    Decision,
    End,
    Fence,
    Forget,
    Lost,
    Moved,
    Prefill,
    Progressed,
    Send,
    WorkersChanged,
)
from router.dispatch import MessageDispatch
from router.inbox import HeartbeatClock
from router.links import WorkerLinks
from router.liveness import LivenessMonitor
from router.metrics import RouterMetrics
from router.migration import Migrator
from router.params import check_engine, request_message, validate
from router.placement import NoLiveWorker, Placement
from router.prefix_affinity import PrefixAffinity
from router.request_table import RequestTable
from router.requests import InvalidRequest, NotReady, Overloaded, RequestHandle, RequestParams
from router.workers import MAX_DETOK_WORKERS, WorkerState, WorkerTable
from splitserve import protocol
from splitserve.config import ClusterConfig
from splitserve.message_limits import max_message_bytes
from splitserve.progress import ProgressRecord, progress_path
from splitserve.protocol import FinishReason, GenerateRequest, RouterHello, TransportCounters

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05


class RouterCore:
    def __init__(
        self,
        config: ClusterConfig,
        vocab_size: int,
        eos_ids: frozenset[int],
        ctx: zmq.Context | None = None,
    ):
        self.config = config
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        # this run of the router (protocol.RouterHello): its start time in microseconds, so a
        # restarted router's is the larger, and workers end its predecessor's requests
        self.incarnation = time.time_ns() // 1000
        # threads mode shares one context (inproc needs it); a process makes its own
        self.ctx = ctx if ctx is not None else zmq.Context()
        self.counters = TransportCounters()
        # when heartbeats arrived, as the inbox's thread read them (router/inbox.py)
        self.clock = HeartbeatClock()
        self.workers = WorkerTable(
            config.addresses, config.lifecycle.liveness_timeout_s, self.clock,
            [config.slots_of(d) for d in range(config.count("decode"))],
        )  # fmt: skip
        self.requests = RequestTable(config.lifecycle.state_ttl_s)
        affinity = None
        if (config.model.prefix_cache and config.router.prefix_affinity
                and config.count("prefill") > 1):  # fmt: skip
            affinity = PrefixAffinity(config.model.prefix_block_tokens)
        self.placement = Placement(
            self.workers, self.workers.decode_slots, config.router.placement, affinity
        )
        self.admission = AdmissionController(config.router, self.workers, self.requests)
        self.metrics = RouterMetrics(config, self.workers, self.admission)
        self.migrator = Migrator(config.router, self.requests, self.placement)
        self.liveness = LivenessMonitor(
            self.workers, self.requests, config.router.stall_timeout_s
        )
        self.dispatch = MessageDispatch(
            self.requests, self.workers, self.placement, self.metrics, self.counters
        )
        self.accepting = True
        self.links: WorkerLinks | None = None  # bound by start()
        self._tasks: list[asyncio.Task] = []
        self._ready_event: asyncio.Event | None = None
        self.detok_target = config.count("detok")  # the pool's size the operator asks for

    # ---- start and stop ----
    async def start(self) -> None:
        self.links = WorkerLinks(
            self.ctx, self.config.addresses, self.counters,
            max_message_bytes("router", self.config), self.config.security.keys_dir, self.clock,
            self._progress_record(),
        )  # fmt: skip
        self.links.detok_pool = self.workers.detok_endpoints()
        self._ready_event = asyncio.Event()
        self.links.start_reading(self._on_message)
        self._tasks = [
            asyncio.create_task(self._monitor(), name="router-monitor"),
            asyncio.create_task(self._say_hello(), name="router-hello"),
        ]

    def _on_message(self, msg: Any, peer: str | None) -> None:
        """A worker's message, handed over by the inbox's thread on the event loop."""
        self.act(self.dispatch(msg, peer))

    async def _monitor(self) -> None:
        """The liveness monitor's passes (router/liveness.py), acted on as they come."""
        async for decisions in self.liveness.passes(self.links.inbox):
            self.act(decisions)

    def _progress_record(self) -> ProgressRecord | None:
        """This process's progress record in the run directory, which its launcher judges it by
        (splitserve/progress.py); none without a run directory."""
        run_dir = self.config.run_dir
        return ProgressRecord(progress_path(run_dir, "router", 0)) if run_dir else None

    async def _say_hello(self) -> None:
        """RouterHello to every worker now and every heartbeat interval: a worker that (re)starts
        or reconnects learns which router it serves, and one that served this router's
        predecessor ends the requests it still runs for it."""
        hello = RouterHello(self.incarnation)
        while True:
            self.links.broadcast(("prefill", "decode", "detok"), hello)
            await asyncio.sleep(self.config.lifecycle.heartbeat_interval_s)

    async def wait_ready(self, timeout_s: float) -> None:
        assert self._ready_event is not None, "start() first"
        await asyncio.wait_for(self._ready_event.wait(), timeout_s)

    def is_ready(self) -> bool:
        return self.accepting and self.workers.pipeline_ready()

    async def drain(self, timeout_s: float) -> None:
        """Stop admitting; let running requests finish for up to timeout_s, then end the rest."""
        self.accepting = False
        self.admission.refuse_waiters("the server is shutting down")
        deadline = time.monotonic() + timeout_s
        while len(self.requests) and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        for handle in self.requests.handles():
            self.end(handle, FinishReason.ERROR, "the server shut down before the request ended")
        if self.links is not None:
            self.links.flush_aborts()

    async def close(self) -> None:
        if self.links is not None:
            self.links.flush_aborts()  # now: a flush still scheduled would meet closed sockets
            self.links.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass

    # ---- a request's life ----
    async def submit(
        self,
        prompt: list[int],
        params: RequestParams,
        request_id: str | None = None,
        claimed: bool = False,
    ) -> RequestHandle:
        """Admit one request; raises InvalidRequest, Overloaded or NotReady. `claimed`: the id
        was claimed from the request table by the caller (the HTTP layer's choices).

        Nothing is held for the request until it is known to be valid and sendable: its message
        is built, encoded and read back by the workers' own decoder first. Then the id is
        reserved and a place in the pipeline taken; every failure from there on gives both back."""
        submitted = time.monotonic()
        params = validate(prompt, params, self.vocab_size, self.config.model.max_seq_len)
        check_engine(params, self.config.model.engine)
        rid = request_id or self.requests.new_id()
        unstamped = request_message(rid, prompt, params, self.eos_ids, self.incarnation)
        self.requests.reserve(rid, claimed)
        try:
            await self._wait_for_pipeline()
            await self.admission.acquire()
        except BaseException as exc:
            self.requests.unreserve(rid)
            if isinstance(exc, Overloaded) and exc.reason:
                self.metrics.rejected.labels(exc.reason).inc()
            raise
        handle = None
        try:
            if not self.is_ready():
                raise NotReady("the pipeline went down while the request was queued")
            handle, frames = self._stamp(unstamped, params, submitted)
            self.requests.add(handle)
        except BaseException as exc:
            if handle is not None:
                self.placement.release(handle)
            self.requests.unreserve(rid)
            self.admission.release()
            if isinstance(exc, NoLiveWorker):  # a worker died since is_ready() said yes
                raise NotReady(str(exc)) from None
            raise
        self._send(handle, frames)
        return handle

    async def _wait_for_pipeline(self) -> None:
        """Return once a request can be placed. While a worker is being replaced (the pipeline
        was ready before) a request waits for it as it would wait in the admission queue;
        before the first ready pipeline, or when shutting down, it is refused at once."""
        if self.is_ready():
            return
        if not self.accepting or not self.workers.ever_ready:
            self.metrics.rejected.labels("not_ready").inc()
            raise NotReady("no full pipeline is ready" if self.accepting else "shutting down")
        if len(self.admission.waiters) >= self.config.router.max_queued:
            self.metrics.rejected.labels("queue_full").inc()
            raise NotReady("a worker is being replaced and the queue is full: try again later")
        deadline = time.monotonic() + self.config.router.queue_timeout_s
        while not self.is_ready():
            if not self.accepting or time.monotonic() > deadline:
                self.metrics.rejected.labels("not_ready").inc()
                raise NotReady("a worker is being replaced: try again later")
            await asyncio.sleep(DRAIN_POLL_S)

    def _stamp(
        self, unstamped: GenerateRequest, params: RequestParams, submitted: float
    ) -> tuple[RequestHandle, list]:
        """The admitted request's handle, placed (router/placement.py), and its message's frames,
        stamped with the workers chosen now."""
        now = time.monotonic()
        handle = RequestHandle(
            unstamped.request_id, len(unstamped.prompt), params, submitted, now,
            deadline=now + self.config.router.request_timeout_s, last_progress=now,
        )  # fmt: skip
        self.placement.place(handle, epoch=0, prompt=unstamped.prompt)
        stamp = handle.stamp
        handle.prefill_seq = self.links.next_seq()
        handle.message = dataclasses.replace(
            unstamped, decode_index=stamp.decode, detok_index=stamp.detok, seq=handle.prefill_seq
        )
        return handle, protocol.encode(handle.message)

    def _send(self, handle: RequestHandle, frames: list) -> None:
        """The registered request goes to its prefill worker. A failure ends it, which gives its
        id and place back (and tells the workers to forget it); one that raised is raised on."""
        try:
            self.metrics.admitted(handle)
            stamp = handle.stamp
            if not self.links.senders[("prefill", stamp.prefill)].send_frames(frames):
                self.end(handle, FinishReason.ERROR, "the prefill worker is not accepting requests")
                return
            log.info(
                "%s admitted: %d prompt tokens, prefill %d, decode %d, detok %d",
                handle.request_id, handle.prompt_tokens, stamp.prefill, stamp.decode, stamp.detok,
            )  # fmt: skip
        except BaseException:
            self.end(handle, FinishReason.ERROR, "the router failed to start the request")
            raise

    def abort(self, handle: RequestHandle) -> None:
        """The client went away or cancelled: end the request and free its resources."""
        self.end(handle, FinishReason.ABORT)

    def end(self, handle: RequestHandle, finish_reason: FinishReason, error: str = "") -> None:
        """The one way a request ends (once: later calls do nothing)."""
        if handle.result is not None:
            return
        handle.end(finish_reason, error)
        self.requests.end(handle)
        self.placement.release(handle)
        self.migrator.waiting.pop(handle.request_id, None)
        self.admission.release()
        self.metrics.ended(handle, time.monotonic())
        if finish_reason in (FinishReason.ABORT, FinishReason.ERROR):
            self.links.abort_soon(handle.request_id, handle.stamp)
        log.info(
            "%s finished: %s, %d tokens%s", handle.request_id, finish_reason.api,
            handle.completion_tokens, f" ({error})" if error else "",
        )  # fmt: skip

    # ---- what the router's parts decide ----
    def act(self, decisions: Iterable[Decision]) -> None:
        """Carry out, in order, what the liveness monitor, the migrator or the dispatch of the
        workers' messages decided (router/decisions.py)."""
        for d in decisions:
            match d:
                case End(handle, reason, error):
                    self.end(handle, reason, error)
                case Progressed():
                    self.admission.grant()
                case Send(role, index, message):
                    self.links.send(role, index, message)
                case Prefill(handle, index, message):
                    handle.prefill_seq = self.links.next_seq()
                    message = dataclasses.replace(message, seq=handle.prefill_seq)
                    self.links.send("prefill", index, message)
                case Forget(request_id, stamp, roles):
                    self.links.abort_soon(request_id, stamp, roles)
                case Lost(worker):
                    self.act(self.migrator.worker_lost(worker))
                case WorkersChanged(ready):
                    self._workers_changed(ready)
                case Fence(index):
                    self.links.fence(index)
                case Moved(role):
                    self.metrics.migrations.labels(role).inc()

    def _workers_changed(self, ready: WorkerState | None = None) -> None:
        """A worker's state may have changed (`ready`: it just said Ready)."""
        self.placement.refresh()
        self.admission.grant()  # a decode worker's Ready may have brought its slots
        if self.links is not None:  # prefill and decode workers learn of detok workers joining
            self.links.follow_detok_pool(self.workers.detok_endpoints(), ready)
        self._move_off_draining_detoks()
        if self.migrator.waiting:
            self.act(self.migrator.retry())
        if self._ready_event is not None and self.workers.pipeline_ready():
            self._ready_event.set()

    def _move_off_draining_detoks(self) -> None:
        """A detok worker that drains (it is stopping) hands its streams to the others."""
        draining = {
            w.index for w in self.workers.of("detok") if w.state == "ready" and not w.live
        }
        if not draining or not self.workers.live_detoks():
            return
        for handle in self.requests.handles():
            if handle.placed and handle.stamp.detok in draining:
                reason = f"detok worker {handle.stamp.detok} drains"
                self.act(self.migrator.move(handle, "detok", reason, planned=True))

    def resize_detok_pool(self, count: int) -> None:
        """The operator wants `count` detok workers, indices 0..count-1 (the launcher or the
        supervisor starts and stops the processes). Workers past it leave the ring now; their
        streams move to the others, losing nothing (router/migration.py)."""
        if not 1 <= count <= MAX_DETOK_WORKERS:
            raise InvalidRequest(f"the detok pool takes 1 to {MAX_DETOK_WORKERS} workers", "count")
        self.detok_target = count
        self.workers.resize_detok_pool(count)
        log.info("detok pool resized to %d worker(s)", count)
        self._workers_changed(None)

    def detok_pool(self) -> dict[str, Any]:
        """The pool as the operator sees it: the size asked for and each worker's state."""
        return {"target": self.detok_target, "workers": self.workers.detok_pool(self.requests)}

    # ---- introspection ----
    def health(self) -> dict[str, Any]:
        return {
            "ready": self.is_ready(),
            "accepting": self.accepting,
            "running": self.admission.running,
            "waiting": len(self.admission.waiters),
            "moving": len(self.migrator.waiting),
            "workers": self.workers.summary(),
        }
