"""Admission: how many requests the pipeline holds at once, and who waits for a place.

Admitting more requests than decode has slots only prefills them early: their first token
streams, then they sit at the decode worker (a long mid-stream pause) while their prefill took CPU
from requests already decoding. So a request is admitted for a free slot, or for one about to
free: one whose holder will have ended by the time the new request's prefill is done
(may_admit_ahead). Beyond the limit requests queue, in order, up to max_queued.

How long a queued request waits follows what the pipeline does, not a fixed bound: a queue that
moves is waited in, as vLLM and llama.cpp do (many more streams than decode slots keep requests
queued for minutes, and each is served in turn). A waiter is refused as overloaded
(429) only when
- the pipeline made no progress for queue_timeout_s: no running request received a token and
  none was admitted (a stuck pipeline, not a busy one), or
- it has waited request_timeout_s, the bound on any request's life, or
- on arrival, the measured service rate (admissions per second over the recent ones) says the
  queue ahead of it would take longer than request_timeout_s: refused at once, not after it.
Past max_queued a request is refused at once (the queue's memory bound).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Protocol

from router.requests import NotReady, Overloaded, RequestHandle
from splitserve.config import RouterConfig

# admission ahead with admit_ahead_tokens = "auto": decode steps per prefill until the workers
# report their timings, and the most it is taken to be
STEPS_PER_PREFILL_UNMEASURED = 4
STEPS_PER_PREFILL_MAX = 64
# prefills of slack in admission ahead: more filled the batches no further and lengthened the
# pause after the first token
AHEAD_SLACK_PREFILLS = 1
# the service rate is measured over this many recent admissions, and trusted from this many on
RATE_WINDOW = 64
RATE_MIN_SAMPLES = 8


class Pipeline(Protocol):
    """What admission reads of the workers (router/workers.py: WorkerTable)."""

    def total_decode_slots(self) -> int:
        """The decode slots of the cluster, as the decode workers reported them."""

    def timings(self) -> tuple[float, float]:
        """The workers' median prefill time and decode step gap in seconds (0 while
        unmeasured)."""


class AdmissionController:
    """Counts the requests in the pipeline (`running`) and queues the rest (`waiters`), for the
    pipeline's decode slots and the live requests (the slots they hold). A refusal is Overloaded
    with its reason, which the router core counts."""

    def __init__(
        self, config: RouterConfig, pipeline: Pipeline, requests: Iterable[RequestHandle]
    ):
        self.config = config
        self.pipeline = pipeline
        self.requests = requests
        self.running = 0
        self.waiters: deque[asyncio.Future] = deque()
        self.admitted_at: deque[float] = deque(maxlen=RATE_WINDOW)  # monotonic times

    async def acquire(self) -> None:
        """Return holding a place in the pipeline; raises Overloaded (queue full, waited too
        long) or NotReady (refused while queued, see refuse_waiters)."""
        if self.running < self.limit() and not self.waiters:
            self.running += 1
            self.admitted_at.append(time.monotonic())
            return
        if len(self.waiters) >= self.config.max_queued:
            raise Overloaded(
                f"{self.running} requests running and {len(self.waiters)} queued: try again later",
                reason="queue_full",
            )
        expected = self.expected_wait(len(self.waiters) + 1)
        if expected > self.config.request_timeout_s:
            raise Overloaded(f"the {len(self.waiters)} queued requests ahead would take about "
                             f"{expected:.0f} s at the measured rate: try again later",
                             reason="queue_too_slow")  # fmt: skip
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await self.wait_while_moving(fut)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release()  # granted just now: hand the place to the next waiter
            elif not fut.done():
                fut.cancel()
            if isinstance(exc, TimeoutError):
                raise Overloaded("timed out waiting for a free slot: try again later",
                                 reason="queue_timeout") from None  # fmt: skip
            raise
        finally:
            if fut in self.waiters:
                self.waiters.remove(fut)

    async def wait_while_moving(self, fut: asyncio.Future) -> None:
        """Until fut is granted; TimeoutError once the pipeline made no progress for
        queue_timeout_s, or after request_timeout_s in all (see the module docstring)."""
        start = time.monotonic()
        stall_s = self.config.queue_timeout_s
        while True:
            now = time.monotonic()
            moved = max(start, self.last_progress())
            timeout = min(start + self.config.request_timeout_s, moved + stall_s) - now
            if timeout <= 0:
                raise TimeoutError
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout)
                return
            except TimeoutError:
                if fut.done():  # granted (or refused) just as the time ran out
                    fut.result()
                    return
                # the bound may have moved while we waited: look again

    def last_progress(self) -> float:
        """When the pipeline last moved: a request admitted, or a token delivered."""
        tokens = max((h.last_progress for h in self.requests), default=0.0)
        return max(self.admitted_at[-1] if self.admitted_at else 0.0, tokens)

    def expected_wait(self, position: int) -> float:
        """Seconds until a waiter at `position` would be admitted, at the rate of the recent
        admissions (0 until enough were seen to measure it)."""
        times = self.admitted_at
        if len(times) < RATE_MIN_SAMPLES or times[-1] <= times[0]:
            return 0.0
        rate = (len(times) - 1) / (times[-1] - times[0])
        return position / rate

    def release(self) -> None:
        """Give a place back, and grant what the limit now allows."""
        self.running -= 1
        self.grant()

    def grant(self) -> None:
        """The longest waiters get admitted while the limit allows (call when it may have
        moved: a place freed, or a request advanced)."""
        while self.waiters and self.running < self.limit():
            fut = self.waiters.popleft()
            if not fut.done():
                self.running += 1  # counted at grant time, so no newcomer can take it first
                self.admitted_at.append(time.monotonic())
                fut.set_result(None)

    def refuse_waiters(self, reason: str) -> None:
        """Every queued request is refused with NotReady(reason) (the router shuts down)."""
        for fut in list(self.waiters):
            if not fut.done():
                fut.set_exception(NotReady(reason))

    def limit(self) -> int:
        """Requests allowed in the pipeline now (never more than max_running): one per decode
        slot, plus one more while a request admitted now would reach the decode worker about
        when a slot frees for it."""
        limit, slots = self.config.max_running, self.pipeline.total_decode_slots()
        if self.running < slots:
            return min(limit, slots)
        per_prefill = self.steps_per_prefill()
        if per_prefill and self.may_admit_ahead(per_prefill, slots):
            return min(limit, self.running + 1)
        return min(limit, self.running)

    def steps_per_prefill(self) -> int:
        """admit_ahead_tokens, or with "auto" the decode steps one prefill takes: the prefill
        worker's median prefill over the decode worker's median step gap."""
        setting = self.config.admit_ahead_tokens
        if setting != "auto":
            return int(setting)
        prefill, step = self.pipeline.timings()
        if not prefill or not step:
            return STEPS_PER_PREFILL_UNMEASURED
        return max(1, min(STEPS_PER_PREFILL_MAX, math.ceil(prefill / step)))

    def may_admit_ahead(self, per_prefill: int, num_slots: int) -> bool:
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
        requests = list(self.requests)
        holding = sorted(
            h.params.max_tokens - h.completion_tokens
            for h in requests
            if h.completion_tokens >= 2  # the first comes from prefill; the second from a slot
        )
        k = self.running - num_slots + 1
        if not 1 <= k <= len(holding):
            return False
        prefilled = sum(1 for h in requests if h.completion_tokens == 1)
        # includes those granted admission but not submitted yet
        in_prefill = self.running - len(holding) - prefilled
        return holding[k - 1] <= (in_prefill + 1 + AHEAD_SLACK_PREFILLS) * per_prefill
