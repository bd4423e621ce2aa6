"""Where a request goes, decided by the router at admission (and again only when a worker dies)
and stamped on it; later hops read the stamps and never choose.

- Detok worker: the hash ring over the live detok workers, by request id (router/hashring.py),
  so that the choice is stable and spreads evenly; a ring change moves only ~1/N of new requests.
- Prefill worker: the live one with the least prefill work ahead of the prompt's first token:
  the tokens the prompts placed there and not yet prefilled will compute, plus this prompt's
  tokens, each less those the worker likely has cached (router/prefix_affinity.py, when prefix
  caching is on: a queued prompt whose prefix is cached there costs only its rest).
  Time to first token is queueing behind other prompts, and a prompt's cost follows the tokens
  it computes, so the least work is the shortest wait; a worker whose queue grows past what its
  cached prefix saves stops being chosen, so one hot prefix cannot pile onto one worker (the
  others cache it too as they take it).
- Decode worker: the live one with the most free slots. A request holds a slot from its insert
  to its end, so a worker's room is its slots less the requests placed on it and not ended;
  room counts those still on their way (in prefill, prefix in flight), which a decode worker's
  own heartbeat cannot see yet. Workers with more slots take proportionally more, and a full one
  is never chosen over one with room.
Both loads are the router's own count of what it has placed, exact at every admission; the
heartbeats (slots, liveness) say who may be chosen. Ties go round-robin. The policy "round_robin"
(router.placement) ignores load and takes the live workers in turn: the baseline the benchmark
(lab/serving/scaleout.py) measures the load policy against.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.hashring import HashRing
from router.prefix_affinity import PrefixAffinity
from router.requests import RequestHandle
from router.workers import WorkerTable
from splitserve.prefix_blocks import block_keys, reusable_blocks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stamp:
    """The workers a request is placed on, at one placement epoch."""

    epoch: int
    prefill: int
    decode: int
    detok: int


class NoLiveWorker(LookupError):
    """No live worker of a role a request needs (one is being replaced)."""


class Placement:
    def __init__(
        self,
        workers: WorkerTable,
        slots_of,
        policy: str = "load",
        affinity: PrefixAffinity | None = None,
    ):
        self.workers = workers
        self.by_load = policy == "load"
        self.affinity = affinity
        self.slots_of = slots_of  # decode index -> its slots
        self.ring = HashRing([])
        self.prefill_tokens: dict[int, int] = {}  # tokens placed, not yet prefilled, uncached
        self.decode_requests: dict[int, int] = {}  # requests placed and not ended
        self._turns = {role: itertools.count() for role in ("prefill", "decode")}

    def refresh(self) -> None:
        """Follow the live detok workers (call when a worker's state may have changed)."""
        live = sorted(self.workers.live_detoks())  # the ring's own order: workers join in any
        if tuple(live) != self.ring.workers:
            self.ring = HashRing(live)
            log.info("hash ring over detok workers %s", live)

    def detok_for(self, request_id: str) -> int:
        if not len(self.ring):
            raise NoLiveWorker("no live detok worker")
        return self.ring.lookup(request_id)

    def place(self, handle: RequestHandle, epoch: int, prompt: Sequence[int] = ()) -> None:
        """Choose the request's three workers, stamp them on it and count it on prefill and
        decode; NoLiveWorker when a role has none (the handle is left as it was). `prompt`: what
        its prefill will run (for prefix affinity)."""
        tokens = _prefill_tokens(handle)
        keys: list[bytes] = []
        if self.affinity is not None and prompt:
            keys = block_keys(prompt, self.affinity.block_tokens,
                              reusable_blocks(len(prompt), self.affinity.block_tokens))  # fmt: skip
        cached = (lambda p: self.affinity.cached_tokens(keys, p)) if keys else (lambda p: 0)
        prefill = self._least(
            "prefill", lambda p: self.prefill_tokens.get(p, 0) + tokens - cached(p)
        )
        decode = self._least(
            "decode", lambda d: self.decode_requests.get(d, 0) - self.slots_of(d)
        )
        handle.stamp = Stamp(epoch, prefill, decode, self.detok_for(handle.request_id))
        handle.prefill_work = tokens - cached(prefill)  # before this prompt's own record
        if keys:
            self.affinity.record(keys, prefill)
        self.prefill_tokens[prefill] = self.prefill_tokens.get(prefill, 0) + handle.prefill_work
        self.decode_requests[decode] = self.decode_requests.get(decode, 0) + 1
        handle.placed = True
        handle.prefill_pending = True

    def prefilled(self, handle: RequestHandle) -> None:
        """The request's prefill is done (a first token of its epoch came): off that queue."""
        if handle.prefill_pending:
            handle.prefill_pending = False
            self.prefill_tokens[handle.stamp.prefill] -= handle.prefill_work

    def release(self, handle: RequestHandle) -> None:
        """The request ended or moves on: it no longer counts where it was placed."""
        if handle.placed:
            self.prefilled(handle)
            self.decode_requests[handle.stamp.decode] -= 1
            handle.placed = False

    def worker_lost(self, role: str, index: int) -> None:
        """A worker died or restarted: what it held is gone (its prefix cache too)."""
        if role == "prefill" and self.affinity is not None:
            self.affinity.forget_worker(index)

    def _least(self, role: str, load: Callable[[int], int]) -> int:
        live = self.workers.live(role)
        if not live:
            raise NoLiveWorker(f"no live {role} worker")
        turn = next(self._turns[role])
        # the lowest load; among equals, the next one in turn
        in_turn = lambda i: (i - turn) % (max(live) + 1)  # noqa: E731
        if not self.by_load:
            return min(live, key=in_turn)
        return min(live, key=lambda i: (load(i), in_turn(i)))


def _prefill_tokens(handle: RequestHandle) -> int:
    """What its prefill runs: the prompt and, when it resumes, the tokens so far."""
    return handle.prompt_tokens + handle.completion_tokens
