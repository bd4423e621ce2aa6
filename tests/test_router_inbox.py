"""Liveness survives a busy router: heartbeats are read by the inbox's own
thread as they arrive, so a router whose event loop was held up (thousands of clients, a flood
answered 429) declares no live worker dead; a worker that really went silent still is; and an
inbox that stopped reading because the loop is far behind judges no one until it has caught up."""

from __future__ import annotations

import asyncio
import signal
import time

import zmq

from router.inbox import HeartbeatClock, Inbox
from splitserve import protocol
from splitserve.protocol import (
    PROTOCOL_VERSION,
    DetokLoad,
    Heartbeat,
    HistogramSnapshot,
    TransportCounters,
)
from splitserve.transport import Receiver
from tests.pipeline_util import make_config, pipeline, run, wait_for

LIVENESS_S = 1.0


def test_a_busy_event_loop_declares_no_live_worker_dead(tokenizer_512):
    """The loop is held for three liveness timeouts (as a flood of clients holds it), then the
    monitor's judgment runs before any message is handled: every worker is alive."""
    config = make_config(tokenizer_512, lifecycle={"liveness_timeout_s": LIVENESS_S})

    async def body():
        async with pipeline(config) as (core, _):
            time.sleep(3 * LIVENESS_S)  # the event loop does nothing else meanwhile
            assert core.workers.expire() == []
            await asyncio.sleep(3 * LIVENESS_S)  # monitor passes, with the backlog handled
            states = {w.key: (w.state, w.restarts) for w in core.workers.workers.values()}
            assert set(states.values()) == {("ready", 0)}, states

    run(body())


def test_a_silent_worker_is_still_declared_dead(tokenizer_512):
    config = make_config(tokenizer_512, lifecycle={"liveness_timeout_s": LIVENESS_S})

    async def body():
        async with pipeline(config) as (core, stack):
            frozen = stack.children[("detok", 1)].popen
            frozen.send_signal(signal.SIGSTOP)
            try:
                detok = core.workers.get("detok", 1)
                await wait_for(lambda: detok.state == "dead", 60, "the frozen worker dead")
                assert all(
                    w.state == "ready" for w in core.workers.workers.values() if w is not detok
                )
            finally:
                frozen.send_signal(signal.SIGCONT)

    run(body())


def heartbeat(pid: int) -> Heartbeat:
    histogram = HistogramSnapshot([0.1], [0, 0], 0.0, 0, 0.0, 0.0, 0.0)
    load = DetokLoad(0, 0, 0, 0, 0, 0, 0, 0, histogram)
    return Heartbeat(
        "detok", 0, pid, PROTOCOL_VERSION, 0.0, False, TransportCounters(), detok=load,
        incarnation="a" * 32,
    )  # fmt: skip


def test_an_inbox_that_stopped_reading_judges_no_one(tmp_path):
    """The loop is held while more messages come than the inbox queues: the thread stops
    reading, and the silence it measures stops growing with it; once the loop handles the
    backlog, the thread reads again and catches up."""
    endpoint = f"ipc://{tmp_path}/router.sock"
    ctx = zmq.Context()
    receiver = Receiver(ctx, endpoint, TransportCounters())
    clock = HeartbeatClock()
    inbox = Inbox(receiver, clock, max_queued=10)
    sender = ctx.socket(zmq.PUSH)
    sender.connect(endpoint)
    handled = []

    async def body():
        inbox.start(asyncio.get_running_loop(), lambda msg, peer: handled.append(msg))
        sender.send_multipart(protocol.encode(heartbeat(1)))
        key = ("detok", 0)
        await wait_for(lambda: handled, 10, "the heartbeat handled")
        # hold the loop; the flood fills the inbox's queue and the thread stops reading
        for pid in range(2, 102):
            sender.send_multipart(protocol.encode(heartbeat(pid)))
        deadline = time.monotonic() + 30
        while not inbox.paused() and time.monotonic() < deadline:
            time.sleep(0.01)
        read = inbox.backlog()
        assert read >= 10  # (a batch at a time: it stops after the one that filled it)
        silent = clock.silent_for(key, "a" * 32)
        for pid in range(102, 122):  # these stay in ZeroMQ's queue
            sender.send_multipart(protocol.encode(heartbeat(pid)))
        time.sleep(3 * LIVENESS_S)
        assert inbox.backlog() == read
        assert clock.silent_for(key, "a" * 32) == silent  # not judged while it cannot read
        await wait_for(lambda: len(handled) == 121, 30, "the backlog handled")
        await wait_for(lambda: clock.silent_for(key, "a" * 32) < LIVENESS_S, 30, "caught up")

    try:
        run(body())
    finally:
        inbox.stop()
        receiver.close()
        sender.close(linger=0)
        ctx.term()


def test_a_foreign_incarnation_keeps_no_worker_alive():
    """The clock notes arrivals per worker and incarnation: heartbeats of another incarnation
    (a forger, or a second process under the same index) do not make the known one look alive."""
    clock = HeartbeatClock()
    clock.caught_up(100.0)
    clock.heard(("decode", 0), "known", 90.0)
    clock.heard(("decode", 0), "forged", 99.0)
    assert clock.silent_for(("decode", 0), "known") == 10.0
    clock.heard(("decode", 0), "known", 99.5)
    assert clock.silent_for(("decode", 0), "known") == 0.5
    assert clock.silent_for(("decode", 1), "never heard") == 0.0
