"""The router core: admission, the hash ring, the request table and worker liveness, over ZeroMQ.

A request's path through the router:
 1. submit() validates the token ids and parameters, clamps max_tokens to the context, and admits
    the request (or queues it, or refuses it with Overloaded / NotReady).
 2. The hash ring over the live detok workers picks the request's detok worker, once; the index is
    stamped on the GenerateRequest sent to the prefill worker.
 3. TextBatches from the detok workers are read by one task and fanned out to the requests'
    handles; the delta that carries a finish reason ends the request.
 4. A client that goes away calls abort(): prefill, decode and the detok worker are told to forget
    the request, and its admission slot is released.
 5. A monitor task marks workers dead when their heartbeats stop, ends every request that depended
    on a dead worker with an error, and ends requests that make no progress in bounded time.
The HTTP layer (router.http) wraps this; tests drive it directly.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
import uuid
from collections import deque
from typing import Any

import zmq

from router.metrics import RouterMetrics
from router.requests import (
    Delta,
    InvalidRequest,
    NotReady,
    Overloaded,
    RequestHandle,
    RequestParams,
)
from router.workers import WorkerState, WorkerTable
from splitserve import protocol
from splitserve.config import ClusterConfig
from splitserve.engine.interface import SamplingParams
from splitserve.hashring import HashRing
from splitserve.protocol import (
    Abort,
    DecodeLoad,
    DetokParams,
    FinishReason,
    GenerateRequest,
    Heartbeat,
    PrefillLoad,
    Ready,
    RequestFailed,
    StopCriteria,
    TextBatch,
    TransportCounters,
)
from splitserve.tombstones import Tombstones
from splitserve.transport import SEND_HWM, Receiver

log = logging.getLogger(__name__)

MAX_SEED = 2**63 - 1
MONITOR_INTERVAL_S = 0.1
READ_BATCH = 256  # worker messages handled per pass of the event loop
# admission ahead with admit_ahead_tokens = "auto": decode steps per prefill until the workers
# report their timings, and the most it is taken to be
STEPS_PER_PREFILL_UNMEASURED = 4
STEPS_PER_PREFILL_MAX = 64
# prefills of slack in admission ahead: 2 measured no fuller batches (96-97%) and twice the
# pause after the first token (p50 94 vs 50 ms; tiny-7m, 16 slots, c=128)
AHEAD_SLACK_PREFILLS = 1


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
        self.max_seq_len = config.model.max_seq_len
        # threads mode shares one context (inproc needs it); a process makes its own
        self.ctx = ctx if ctx is not None else zmq.Context()
        self.counters = TransportCounters()
        self.workers = WorkerTable(config.detok_count, config.lifecycle.liveness_timeout_s)
        self.ring = HashRing([])
        self.requests: dict[str, RequestHandle] = {}
        self.recent_ids = Tombstones(config.lifecycle.state_ttl_s)  # ended, still tombstoned
        self.waiters: deque[asyncio.Future] = deque()
        self.running = 0
        # Admitting more requests than decode has slots only prefills them early: their first
        # token streams, then they sit at the decode worker (a long mid-stream pause) while
        # their prefill took CPU from requests already decoding. So a request is admitted for
        # a free slot, or for one about to free (see _may_admit_ahead).
        self.num_slots = config.model.num_slots
        self.accepting = True
        self.metrics = RouterMetrics(self.workers, lambda: self.running, lambda: len(self.waiters))
        self._tasks: list[asyncio.Task] = []
        self._pending_aborts: dict[str, int] = {}
        self._sockets: list[zmq.Socket] = []
        self.receiver: Receiver | None = None  # bound by start()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_event: asyncio.Event | None = None

    # ---- start and stop ----
    async def start(self) -> None:
        a = self.config.addresses
        self.receiver = Receiver(self.ctx, a.router, self.counters)
        self.prefill = self._connect(a.prefill)
        self.decode = self._connect(a.decode)
        self.detoks = [self._connect(addr) for addr in a.detok]
        self._ready_event = asyncio.Event()
        # receiving is a reader on the socket's descriptor: no future per message, as
        # zmq.asyncio's recv would cost
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.receiver.socket.getsockopt(zmq.FD), self._on_readable)
        self._loop.call_soon(self._on_readable)  # whatever came before the reader was added
        self._tasks = [asyncio.create_task(self._monitor_loop(), name="router-monitor")]

    def _connect(self, endpoint: str) -> zmq.Socket:
        # a plain socket: sends never block, so the event loop needs no futures for them
        s = self.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, SEND_HWM)
        s.connect(endpoint)
        self._sockets.append(s)
        return s

    async def wait_ready(self, timeout_s: float) -> None:
        assert self._ready_event is not None, "start() first"
        await asyncio.wait_for(self._ready_event.wait(), timeout_s)

    def is_ready(self) -> bool:
        return self.accepting and self.workers.pipeline_ready()

    async def drain(self, timeout_s: float) -> None:
        """Stop admitting; let running requests finish for up to timeout_s, then end the rest."""
        self.accepting = False
        for w in list(self.waiters):
            if not w.done():
                w.set_exception(NotReady("the server is shutting down"))
        deadline = time.monotonic() + timeout_s
        while self.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for handle in list(self.requests.values()):
            self._end(handle, FinishReason.ERROR, "the server shut down before the request ended")
        self._flush_aborts()

    async def close(self) -> None:
        receiver = self.receiver
        if receiver is not None and not receiver.socket.closed:
            if self._loop is not None:
                self._loop.remove_reader(receiver.socket.getsockopt(zmq.FD))
            receiver.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        for s in self._sockets:
            s.close(linger=0)
        self._sockets.clear()

    # ---- submit ----
    async def submit(
        self, prompt: list[int], params: RequestParams, request_id: str | None = None
    ) -> RequestHandle:
        """Admit one request; raises InvalidRequest, Overloaded or NotReady."""
        submitted = time.monotonic()
        params = self._validate(prompt, params)
        rid = request_id or f"req-{uuid.uuid4().hex}"
        if rid in self.requests:
            raise InvalidRequest(f"request id {rid!r} is already in flight", "request_id")
        self.recent_ids.prune()
        if rid in self.recent_ids:  # workers drop messages of recently ended ids for a while
            raise InvalidRequest(f"request id {rid!r} was used moments ago", "request_id")
        if not self.is_ready():
            self.metrics.rejected.labels("not_ready").inc()
            raise NotReady("no full pipeline is ready" if self.accepting else "shutting down")
        if self.running >= self.admission_limit() or self.waiters:
            await self._wait_for_admission()  # returns holding an admission slot
            if not self.is_ready():
                self._release_admission()
                raise NotReady("the pipeline went down while the request was queued")
        else:
            self.running += 1
        now = time.monotonic()
        detok_index = self.ring.lookup(rid)
        handle = RequestHandle(
            rid, len(prompt), detok_index, params, submitted, now,
            deadline=now + self.config.router.request_timeout_s, last_progress=now,
        )  # fmt: skip
        handle._abort_cb = self._client_abort
        self.requests[rid] = handle
        self.metrics.admitted(handle)
        seed = params.seed if params.seed is not None else secrets.randbelow(MAX_SEED)
        msg = GenerateRequest(
            rid,
            detok_index,
            list(prompt),
            SamplingParams(params.temperature, params.top_p, params.top_k, seed),
            StopCriteria(
                params.max_tokens, params.min_tokens, params.ignore_eos, self.eos_ids,
                list(params.stop_token_ids),
            ),
            DetokParams(
                params.skip_special_tokens, list(params.stop), params.include_stop_str_in_output,
                params.min_tokens,
            ),
            params.logprobs,
        )  # fmt: skip
        if not self._send(self.prefill, msg):
            self._end(handle, FinishReason.ERROR, "the prefill worker is not accepting requests")
        log.info("%s admitted: %d prompt tokens, detok %d", rid, len(prompt), detok_index)
        return handle

    def _validate(self, prompt: list[int], p: RequestParams) -> RequestParams:
        if not prompt:
            raise InvalidRequest("the prompt is empty", "prompt")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt):
            raise InvalidRequest(f"prompt token ids must be in [0, {self.vocab_size})", "prompt")
        room = self.max_seq_len - len(prompt)
        if room < 1:
            raise InvalidRequest(
                f"the prompt has {len(prompt)} tokens; this model's context is {self.max_seq_len}"
                " tokens, which leaves no room for output",
                "prompt",
            )
        if p.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1", "max_tokens")
        if not 0 <= p.min_tokens <= p.max_tokens:
            raise InvalidRequest("min_tokens must be between 0 and max_tokens", "min_tokens")
        if not 0.0 <= p.temperature <= 100.0:
            raise InvalidRequest("temperature must be between 0 and 100", "temperature")
        if not 0.0 < p.top_p <= 1.0:
            raise InvalidRequest("top_p must be in (0, 1]", "top_p")
        if p.top_k < 0:
            raise InvalidRequest("top_k must be 0 (off) or positive", "top_k")
        if p.seed is not None and not 0 <= p.seed <= MAX_SEED:
            raise InvalidRequest(f"seed must be in [0, {MAX_SEED}]", "seed")
        if any(not s for s in p.stop) or len(p.stop) > 16:
            raise InvalidRequest("stop strings must be non-empty, at most 16 of them", "stop")
        if any(not 0 <= t < self.vocab_size for t in p.stop_token_ids):
            raise InvalidRequest("stop_token_ids must be valid token ids", "stop_token_ids")
        if p.max_tokens > room:
            from dataclasses import replace

            p = replace(p, max_tokens=room, min_tokens=min(p.min_tokens, room))
        return p

    async def _wait_for_admission(self) -> None:
        if len(self.waiters) >= self.config.router.max_queued:
            self.metrics.rejected.labels("queue_full").inc()
            raise Overloaded(
                f"{self.running} requests running and {len(self.waiters)} queued: try again later"
            )
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.config.router.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release_admission()  # granted just now: hand the slot to the next waiter
            elif not fut.done():
                fut.cancel()
            if isinstance(exc, TimeoutError):
                self.metrics.rejected.labels("queue_timeout").inc()
                raise Overloaded("timed out waiting for a free slot: try again later") from None
            raise
        finally:
            if fut in self.waiters:
                self.waiters.remove(fut)

    def admission_limit(self) -> int:
        """Requests allowed in the pipeline now (never more than max_running): one per decode
        slot, plus one more while a request admitted now would reach the decode worker about
        when a slot frees for it (see _may_admit_ahead)."""
        limit = self.config.router.max_running
        if self.running < self.num_slots:
            return min(limit, self.num_slots)
        per_prefill = self._steps_per_prefill()
        if per_prefill and self._may_admit_ahead(per_prefill):
            return min(limit, self.running + 1)
        return min(limit, self.running)

    def _steps_per_prefill(self) -> int:
        """admit_ahead_tokens, or with "auto" the decode steps one prefill takes: the prefill
        worker's median prefill over the decode worker's median step gap, both from their
        heartbeats."""
        setting = self.config.router.admit_ahead_tokens
        if setting != "auto":
            return int(setting)
        prefill = step = 0.0
        for w in self.workers.workers.values():
            load = w.load
            if isinstance(load, PrefillLoad):
                prefill = max(prefill, load.prefill_time.p50)
            elif isinstance(load, DecodeLoad):
                step = load.step_gap.p50
        if not prefill or not step:
            return STEPS_PER_PREFILL_UNMEASURED
        return max(1, min(STEPS_PER_PREFILL_MAX, math.ceil(prefill / step)))

    def _may_admit_ahead(self, per_prefill: int) -> bool:
        """Whether one more request, admitted now while every slot is taken or promised, would
        reach the decode worker about when a slot frees for it.

        Requests that have a decoded token hold a slot. The others (in prefill, or prefilled
        and waiting at the decode worker) take, in turn, the free slots and then the slots of
        the holders with the fewest tokens left; with `running` admitted for `num_slots` slots,
        the new one would take the k-th holder's, k = running - num_slots + 1. Prefills run one
        after another: its own is done after those still queued, about (queued + 1) *
        per_prefill decode steps from now. It is admitted if the slot frees by then, or at most
        AHEAD_SLACK_PREFILLS prefills later: the slack keeps a slot from idling when a prefill
        runs slow, at the price of a pause after the first token of that much. Counts on
        max_tokens: a request that ends sooner (eos, a stop string) leaves its slot idle until
        the next prefill is done."""
        holding = sorted(
            h.params.max_tokens - h.completion_tokens
            for h in self.requests.values()
            if h.completion_tokens >= 2  # the first comes from prefill; the second from a slot
        )
        k = self.running - self.num_slots + 1
        if not 1 <= k <= len(holding):
            return False
        prefilled = sum(1 for h in self.requests.values() if h.completion_tokens == 1)
        # includes those granted admission but not submitted yet
        in_prefill = self.running - len(holding) - prefilled
        return holding[k - 1] <= (in_prefill + 1 + AHEAD_SLACK_PREFILLS) * per_prefill

    def _release_admission(self) -> None:
        """Give an admission slot back, and grant what the limit now allows."""
        self.running -= 1
        self._grant()

    def _grant(self) -> None:
        """The longest waiters get admitted while the limit allows."""
        while self.waiters and self.running < self.admission_limit():
            fut = self.waiters.popleft()
            if not fut.done():
                self.running += 1  # counted at grant time, so no newcomer can take it first
                fut.set_result(None)

    # ---- ending requests ----
    def _end(self, handle: RequestHandle, finish_reason: FinishReason, error: str = "") -> None:
        if handle.result is not None:
            return
        handle.end(finish_reason, error)
        self.requests.pop(handle.request_id, None)
        self.recent_ids.add(handle.request_id)
        self._release_admission()
        self.metrics.ended(handle, time.monotonic())
        if finish_reason in (FinishReason.ABORT, FinishReason.ERROR):
            self._abort_soon(handle)
        log.info(
            "%s finished: %s, %d tokens%s", handle.request_id, finish_reason.api,
            handle.completion_tokens, f" ({error})" if error else "",
        )  # fmt: skip

    def _client_abort(self, handle: RequestHandle) -> None:
        self._end(handle, FinishReason.ABORT)

    def _abort_soon(self, handle: RequestHandle) -> None:
        """Aborts are batched: one Abort message per worker per event-loop turn."""
        if not self._pending_aborts:
            asyncio.get_running_loop().call_soon(self._flush_aborts)
        self._pending_aborts[handle.request_id] = handle.detok_index

    def _flush_aborts(self) -> None:
        if not self._pending_aborts:
            return
        aborts, self._pending_aborts = self._pending_aborts, {}
        rids = list(aborts)
        self._send(self.prefill, Abort(rids))
        self._send(self.decode, Abort(rids))
        by_detok: dict[int, list[str]] = {}
        for rid, k in aborts.items():
            by_detok.setdefault(k, []).append(rid)
        for k, ids in by_detok.items():
            self._send(self.detoks[k], Abort(ids))

    def _send(self, socket: zmq.Socket, msg: Any) -> bool:
        try:
            socket.send_multipart(protocol.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            self.counters.dropped += 1
            log.warning("router: send of %s dropped", type(msg).__name__)
            return False
        self.counters.sent += 1
        return True

    # ---- receiving ----
    def _on_readable(self) -> None:
        """Dispatch the messages waiting, up to READ_BATCH, then again on the next pass of the
        event loop while more wait, so that the clients' streams get a turn under a flood.

        The descriptor only says that the socket's state may have changed; reading until no
        message waits (Receiver.pending) is what re-arms it.
        """
        for msg, _ in self.receiver.drain(READ_BATCH):
            try:
                self._dispatch(msg)
            except Exception:  # a bug must not stop the router from reading its workers
                log.exception("router: failed to handle %s", type(msg).__name__)
        if self.receiver.pending():
            self._loop.call_soon(self._on_readable)

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, TextBatch):
            now = time.monotonic()
            for d in msg.deltas:
                handle = self.requests.get(d.request_id)
                if handle is None:
                    continue  # already ended here (aborted, failed): late output is dropped
                previous = handle.first_token_at and handle.last_progress
                handle.push(Delta(d.text, d.token_ids, d.logprobs))
                self.metrics.delta(handle, len(d.token_ids), now, previous)
                if d.finish_reason:
                    self._end(handle, d.finish_reason)
            if self.waiters:
                self._grant()
        elif isinstance(msg, Ready | Heartbeat):
            worker, lost = self.workers.observe(msg)
            if worker is not None and lost:
                self._worker_lost(worker)
            self._refresh_ring()
        elif isinstance(msg, RequestFailed):
            for rid in msg.request_ids:
                handle = self.requests.get(rid)
                if handle is not None:
                    self._end(handle, FinishReason.ERROR, f"{msg.role}: {msg.message}")
        else:
            self.counters.malformed += 1
            log.warning("router: unexpected %s", type(msg).__name__)

    def _refresh_ring(self) -> None:
        live = self.workers.live_detoks()
        if tuple(live) != self.ring.workers:
            self.ring = HashRing(live)
            log.info("hash ring over detok workers %s", live)
        if self._ready_event is not None and self.workers.pipeline_ready():
            self._ready_event.set()

    # ---- liveness and timeouts ----
    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(MONITOR_INTERVAL_S)
            for w in self.workers.expire():
                self._worker_lost(w)
            self._refresh_ring()
            self._expire_requests()
            self.recent_ids.prune()

    def _worker_lost(self, w: WorkerState) -> None:
        """End every request that depended on worker w."""
        reason = f"{w.role} worker {w.index} died"
        for handle in list(self.requests.values()):
            if w.role == "detok":
                hit = handle.detok_index == w.index
            elif w.role == "prefill":
                hit = handle.completion_tokens == 0  # not past prefill yet
            else:
                hit = True  # decode holds, or is about to hold, every running request
            if hit:
                self._end(handle, FinishReason.ERROR, reason)

    def _expire_requests(self) -> None:
        """The backstop for requests lost without a worker dying (a message lost in a crash):
        no output for stall_timeout_s. A request still queued at the prefill worker, or (while the
        decode worker has prefixes waiting) still waiting for a decode slot, is not lost: only its
        overall deadline and the liveness of its workers bound it."""
        now = time.monotonic()
        stall = self.config.router.stall_timeout_s
        decode = self.workers.get("decode", 0)
        load = decode.load if decode else None
        slots_contended = isinstance(load, DecodeLoad) and load.pending > 0
        for handle in list(self.requests.values()):
            if now > handle.deadline:
                self._end(handle, FinishReason.ERROR, "request timed out")
            elif handle.first_token_at is None:
                continue
            elif handle.completion_tokens <= 1 and slots_contended:
                continue
            elif now - handle.last_progress > stall:
                self._end(handle, FinishReason.ERROR, f"no progress for {stall:.0f} s")

    # ---- introspection ----
    def health(self) -> dict[str, Any]:
        return {
            "ready": self.is_ready(),
            "accepting": self.accepting,
            "running": self.running,
            "waiting": len(self.waiters),
            "workers": self.workers.summary(),
        }
