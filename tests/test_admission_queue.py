"""The admission queue waits while the pipeline moves and refuses only a stuck one, or a queue the
measured service rate says would outlast request_timeout_s (router/admission.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from router.admission import RATE_MIN_SAMPLES, AdmissionController
from router.requests import Overloaded
from splitserve.config import RouterConfig

pytestmark = pytest.mark.timeout(60)


@dataclass
class Running:
    last_progress: float
    completion_tokens: int = 0


class OneSlot:
    """A pipeline of one decode slot whose workers have measured nothing yet."""

    def total_decode_slots(self) -> int:
        return 1

    def timings(self) -> tuple[float, float]:
        return 0.0, 0.0


class Recorded(AdmissionController):
    """Keeps the reason of every refusal, as the router core counts them (its metrics)."""

    rejected: list[str]

    async def acquire(self) -> None:
        try:
            await super().acquire()
        except Overloaded as exc:
            self.rejected.append(exc.reason)
            raise


def controller(requests: list, **router) -> tuple[AdmissionController, list[str]]:
    config = RouterConfig(**{"max_running": 1, "max_queued": 8, **router})
    ctl = Recorded(config, OneSlot(), requests)
    ctl.rejected = []
    return ctl, ctl.rejected


def test_a_moving_pipeline_is_waited_for_past_queue_timeout():
    """The waiter waits four times queue_timeout_s while tokens keep arriving, then gets in."""
    running = Running(time.monotonic())
    ctl, rejected = controller([running], queue_timeout_s=0.5, request_timeout_s=60.0)

    async def body():
        await ctl.acquire()  # the one place
        waiter = asyncio.create_task(ctl.acquire())
        start = time.monotonic()
        while time.monotonic() - start < 2.0:  # tokens flow: the pipeline moves
            running.last_progress = time.monotonic()
            await asyncio.sleep(0.02)
            assert not waiter.done(), "refused while the pipeline moved"
        ctl.release()
        await asyncio.wait_for(waiter, 10)

    asyncio.run(body())
    assert rejected == []


def test_a_stuck_pipeline_refuses_its_waiters():
    ctl, rejected = controller([Running(time.monotonic())], queue_timeout_s=0.3)

    async def body():
        await ctl.acquire()
        with pytest.raises(Overloaded, match="timed out waiting for a free slot"):
            await asyncio.wait_for(ctl.acquire(), 30)

    asyncio.run(body())
    assert rejected == ["queue_timeout"]
    assert not ctl.waiters and ctl.running == 1


def test_a_queue_slower_than_the_request_timeout_is_refused_on_arrival():
    ctl, rejected = controller([], request_timeout_s=10.0, max_queued=64)
    now = time.monotonic()
    # one admission every 2 s, measured: the queue ahead of a newcomer at position 6 takes 12 s
    ctl.admitted_at.extend(now - 2.0 * i for i in reversed(range(RATE_MIN_SAMPLES)))
    assert ctl.expected_wait(6) == pytest.approx(12.0)
    assert ctl.expected_wait(4) == pytest.approx(8.0)

    async def body():
        ctl.running = 1  # the place is taken
        ctl.waiters.extend(asyncio.get_running_loop().create_future() for _ in range(5))
        with pytest.raises(Overloaded, match="would take about 12 s"):
            await ctl.acquire()

    asyncio.run(body())
    assert rejected == ["queue_too_slow"]


def test_no_estimate_before_enough_admissions():
    ctl, _ = controller([])
    ctl.admitted_at.extend([1.0, 2.0])
    assert ctl.expected_wait(100) == 0.0
