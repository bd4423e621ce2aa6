"""Load shapes: a fixed number of requests in flight, or Poisson arrivals at a fixed rate.

Both take `send(index) -> RequestResult` and call `on_done(result)` as each request ends (the
progress bar). With a rate, `max_concurrency` (optional) caps the requests in flight; arrivals
beyond it wait, as clients of a saturated server would.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from splitserve.bench.client import RequestResult

Send = Callable[[int], Awaitable[RequestResult]]


@dataclass(frozen=True)
class LoadSpec:
    num_requests: int
    concurrency: int | None = None  # requests in flight (fixed-concurrency load)
    rate: float | None = None  # requests per second, Poisson arrivals (open-loop load)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError("num_requests must be at least 1")
        if self.concurrency is None and self.rate is None:
            raise ValueError("give a concurrency or a rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be positive")

    @property
    def label(self) -> str:
        if self.rate is not None:
            cap = f", max {self.concurrency} in flight" if self.concurrency else ""
            return f"rate {self.rate:g}/s{cap}"
        return f"concurrency {self.concurrency}"


async def run_load(
    spec: LoadSpec, send: Send, on_done: Callable[[RequestResult], None] = lambda r: None
) -> tuple[list[RequestResult], float]:
    """Run spec.num_requests requests; return their results (by index) and the wall time."""
    results: list[RequestResult | None] = [None] * spec.num_requests

    async def one(index: int) -> None:
        r = await send(index)
        results[index] = r
        on_done(r)

    start = time.perf_counter()
    if spec.rate is None:
        await _closed_loop(spec, one)
    else:
        await _poisson(spec, one)
    duration = time.perf_counter() - start
    return [r for r in results if r is not None], duration


async def _closed_loop(spec: LoadSpec, one: Callable[[int], Awaitable[None]]) -> None:
    next_index = iter(range(spec.num_requests))

    async def worker() -> None:
        for index in next_index:  # a shared iterator: each index is taken exactly once
            await one(index)

    assert spec.concurrency is not None
    await asyncio.gather(*(worker() for _ in range(min(spec.concurrency, spec.num_requests))))


async def _poisson(spec: LoadSpec, one: Callable[[int], Awaitable[None]]) -> None:
    assert spec.rate is not None
    rng = random.Random(spec.seed)
    limit = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None

    async def capped(index: int) -> None:
        if limit is None:
            await one(index)
            return
        async with limit:
            await one(index)

    tasks = []
    t0 = time.perf_counter()
    arrival = 0.0
    for index in range(spec.num_requests):
        delay = t0 + arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(capped(index)))
        arrival += rng.expovariate(spec.rate)
    await asyncio.gather(*tasks)
