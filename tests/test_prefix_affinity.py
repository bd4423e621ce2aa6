"""Prefix-aware placement of prefill work: a prompt goes where its beginning was sent before while
that worker's queue is no longer than what the cached prefix saves, so one hot prefix spreads
over the workers instead of piling onto one; a restarted worker is no longer thought to hold
anything."""

from __future__ import annotations

import time

from router.placement import Placement
from router.prefix_affinity import PrefixAffinity
from router.requests import RequestHandle, RequestParams
from router.workers import WorkerTable
from splitserve.config import Addresses
from splitserve.prefix_blocks import block_keys

BLOCK = 16


def _placement(prefill_workers: int = 2) -> Placement:
    addresses = Addresses(
        "ipc:///tmp/r", tuple(f"ipc:///tmp/p{i}" for i in range(prefill_workers)),
        ("ipc:///tmp/d0",), ("ipc:///tmp/k0",),
    )  # fmt: skip
    workers = WorkerTable(addresses, 60.0)
    for w in workers.workers.values():
        w.state, w.pid, w.last_seen = "ready", 1, time.monotonic()
    placement = Placement(workers, lambda d: 1 << 20, "load", PrefixAffinity(BLOCK))
    placement.refresh()
    return placement


def _handle(i: int, prompt: list[int]) -> RequestHandle:
    now = time.monotonic()
    return RequestHandle(f"r{i}", len(prompt), RequestParams(), now, now, now + 60)


SYSTEM = list(range(1000, 1000 + 64 * BLOCK))  # a 1,024-token system prompt


def _prompt(i: int) -> list[int]:
    return SYSTEM + [i % 97 + 1] * 32


def test_a_shared_prefix_goes_back_where_it_was_cached():
    placement = _placement()
    first = _handle(0, _prompt(0))
    placement.place(first, 0, _prompt(0))
    placement.prefilled(first)  # its prefill ran: that worker's queue is empty again
    for i in range(1, 20):
        h = _handle(i, _prompt(i))
        placement.place(h, 0, _prompt(i))
        assert h.stamp.prefill == first.stamp.prefill  # the cache saves more than the queue costs
        placement.prefilled(h)


def test_a_hot_prefix_spreads_once_the_queue_outweighs_the_saving():
    placement = _placement()
    handles = []
    for i in range(40):  # a burst: nothing prefilled yet, every prompt queued
        h = _handle(i, _prompt(i))
        placement.place(h, 0, _prompt(i))
        handles.append(h)
    on = [sum(h.stamp.prefill == p for h in handles) for p in (0, 1)]
    assert min(on) >= 10, on  # both workers take a share of the burst


def test_a_restarted_worker_is_thought_to_hold_nothing():
    placement = _placement()
    first = _handle(0, _prompt(0))
    placement.place(first, 0, _prompt(0))
    placement.prefilled(first)
    placement.worker_lost("prefill", first.stamp.prefill)
    keys = block_keys(_prompt(0), BLOCK)
    assert placement.affinity.cached_tokens(keys, first.stamp.prefill) == 0
