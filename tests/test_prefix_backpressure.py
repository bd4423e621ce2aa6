"""A prefix that a decode worker's socket does not take now is never dropped:
it waits in the prefill worker's outbox (prefill_worker/outbox.py) and goes, in order, once the
decode worker reads. What waits is bounded in bytes: over the bound, that decode worker's
requests stay queued unprefilled while others go ahead, and an Abort takes a waiting prefix out.
Real sockets over ipc; a decode worker that is not reading yet is an address no one has bound,
bound later; the bounds are made small with the test-only faults of splitserve/faults.py."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import zmq

from prefill_worker.worker import PrefillWorker
from router.decisions import End
from router.liveness import LivenessMonitor
from router.placement import Stamp
from router.request_table import RequestTable
from router.requests import RequestHandle, RequestParams
from router.workers import WorkerTable
from splitserve import protocol
from splitserve.config import Addresses
from splitserve.message_limits import (
    HEADER_MARGIN_BYTES,
    PREFIX_OUTBOX_BYTES,
    PREFIX_QUEUE_BYTES,
    prefix_send_hwm,
)
from splitserve.protocol import (
    PROTOCOL_VERSION,
    Abort,
    DecodeLoad,
    DetokParams,
    FinishReason,
    GenerateRequest,
    Heartbeat,
    PrefillLoad,
    PrefixHeader,
    Ready,
    RequestFailed,
    StopCriteria,
    TransportCounters,
    WorkerInfo,
)
from splitserve.protocol.params import SamplingParams
from splitserve.stats import Histogram
from splitserve.tokenizers import load_tokenizer
from splitserve.transport import SEND_HWM, Receiver, Sender
from tests.default_shape import default_model_shape
from tests.pipeline_util import expected_fake_tokens, make_config, pipeline, run, wait_for

DEADLINE_S = 60.0


def test_the_default_models_prefix_queues_hold_about_a_gib(tokenizer_512):
    config = make_config(tokenizer_512, model={"max_seq_len": 2048})
    per_token = default_model_shape().kv_bytes_per_token(4)  # SmolLM2-135M, a float32 cache
    hwm = prefix_send_hwm(config, per_token)
    assert hwm == 5  # not the 100,000 of the control senders: 9 TB of prefixes
    largest = per_token * 2048 + HEADER_MARGIN_BYTES
    assert hwm * largest + PREFIX_OUTBOX_BYTES <= PREFIX_QUEUE_BYTES
    huge = prefix_send_hwm(config, per_token * 100)
    assert huge == 2  # a model whose prefix alone is over the budget still queues two
    assert prefix_send_hwm(config, 0) < SEND_HWM


def test_a_sender_offers_without_counting_a_drop(tmp_path):
    ctx = zmq.Context()
    counters = TransportCounters()
    sender = Sender(ctx, f"ipc://{tmp_path}/nobody.sock", counters, hwm=3)
    try:
        msg = RequestFailed(["r"], [0], "prefill", "x")
        offered = [sender.offer(protocol.encode(msg)) for _ in range(5)]
        assert offered == [True] * 3 + [False] * 2
        assert (counters.sent, counters.dropped) == (3, 0)  # the caller keeps what is refused
        assert sender.send(msg) is False and counters.dropped == 1  # a plain send drops
    finally:
        sender.close()
        ctx.destroy(linger=0)


def request(rid: str, decode: int = 0, epoch: int = 0, router: int = 0) -> GenerateRequest:
    return GenerateRequest(
        rid, epoch, decode, 1, [5, 6, 7], 0, SamplingParams(), StopCriteria(max_tokens=8),
        DetokParams(), router_incarnation=router,
    )  # fmt: skip


class Worker:
    """A real prefill worker (fake engine) with its decode sockets' queues and outbox bounded
    by the faults given; the router's address is read here, each decode worker's only once
    bind(d) was called."""

    def __init__(self, config, faults: str) -> None:
        self.ctx = zmq.Context()
        self.config = config
        self.router = Receiver(self.ctx, config.addresses.router, TransportCounters())
        self.worker = PrefillWorker(config, 0, self.ctx, threading.Event(),
                                    {"SPLITSERVE_FAULTS": faults})  # fmt: skip
        self.decodes: dict[int, Receiver] = {}
        self.got: dict[int, list[str]] = {}
        self.failed: list[str] = []

    def bind(self, d: int) -> None:
        self.decodes[d] = Receiver(self.ctx, self.config.addresses.decode[d], TransportCounters())
        self.got[d] = []

    def read(self) -> None:
        for d, receiver in self.decodes.items():
            for msg, frames in receiver.drain():
                assert isinstance(msg, PrefixHeader) and len(frames) == 1
                self.got[d].append(msg.request_id)
        for msg, _ in self.router.drain():
            if isinstance(msg, RequestFailed):
                self.failed.extend(msg.request_ids)

    def until(self, done, what: str) -> None:
        """Loop passes of the worker, reading what it sends, until done() holds."""
        deadline = time.monotonic() + DEADLINE_S
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.worker.loop_once()
            self.read()

    def close(self) -> None:
        self.worker.shutdown()
        for receiver in [self.router, *self.decodes.values()]:
            receiver.close()
        self.ctx.destroy(linger=0)


def test_a_burst_to_a_decode_worker_not_reading_loses_none(tokenizer_512):
    """(a) Twenty prefixes for a decode worker that reads nothing yet: two fill its socket's
    queue, the rest wait; none is failed, and once it reads it gets all twenty, in order."""
    w = Worker(make_config(tokenizer_512, "processes"), "prefill_to_decode_hwm=2")
    try:
        for i in range(20):
            w.worker.prefill(request(f"r{i}"))
        assert w.worker.outbox.counts() == [18]
        load = w.worker.load()
        assert (load.outbox, load.outbox_waited, load.queue) == ([18], 18, 0)
        w.bind(0)
        w.until(lambda: len(w.got[0]) == 20, "every prefix at the decode worker")
        assert w.got[0] == [f"r{i}" for i in range(20)]
        assert w.worker.outbox.empty() and w.worker.idle()
        assert w.worker.counters.dropped == 0
        w.read()
        assert w.failed == []
    finally:
        w.close()


def test_over_its_byte_bound_a_decode_workers_requests_wait_unprefilled(tokenizer_512):
    """(b) Decode worker 0 reads nothing, its socket queues one prefix and its outbox holds at
    most one byte's worth: its third request is not prefilled (the engine runs one prompt a
    call here), while every request for decode worker 1 is; the held ones stay queued, in order,
    in the load report too, and go once decode worker 0 reads."""
    config = make_config(tokenizer_512, "processes", cluster={"decode_workers": 2},
                         model={"prefill_batch_tokens": 0})  # fmt: skip
    w = Worker(config, "prefill_to_decode_hwm=1,prefill_to_decode_outbox_bytes=1")
    try:
        w.bind(1)
        for i in range(6):
            w.worker.on_generate(request(f"a{i}", decode=0), [])
            w.worker.on_generate(request(f"b{i}", decode=1), [])
        w.until(lambda: len(w.got[1]) == 6, "decode worker 1's prefixes")
        assert w.got[1] == [f"b{i}" for i in range(6)]
        for _ in range(20):  # more passes change nothing while decode worker 0 reads nothing
            w.worker.loop_once()
        # a0 in the socket's queue, a1 in the outbox (over one byte): a2.. not prefilled
        assert w.worker.prefills == 6 + 2
        assert [r.request_id for r in w.worker.queue] == [f"a{i}" for i in range(2, 6)]
        load = w.worker.load()
        assert (load.queue, load.queued_tokens, load.outbox) == (4, 12, [1, 0])
        assert w.worker.outbox.held() == {0} and not w.worker.has_ready()
        w.bind(0)
        w.until(lambda: len(w.got[0]) == 6, "decode worker 0's prefixes")
        assert w.got[0] == [f"a{i}" for i in range(6)]
        assert w.worker.prefills == 12 and w.worker.idle()
        w.read()
        assert w.failed == []
    finally:
        w.close()


def test_an_abort_removes_a_waiting_prefix(tokenizer_512):
    """(c) r1 and r2 wait in the outbox; an Abort of r1 takes it out (an Abort of an earlier
    epoch than r2's leaves r2), and the decode worker then gets r0 and r2 only."""
    w = Worker(make_config(tokenizer_512, "processes"), "prefill_to_decode_hwm=1")
    try:
        w.worker.prefill(request("r0"))
        w.worker.prefill(request("r1"))
        w.worker.prefill(request("r2", epoch=3))
        assert w.worker.outbox.counts() == [2]
        w.worker.on_abort(Abort(["r1", "r2"], [0, 2]), [])
        assert w.worker.outbox.counts() == [1]
        assert w.worker.outbox.bytes == [w.worker.outbox.waiting[0][0].nbytes]
        w.bind(0)
        w.until(lambda: w.worker.outbox.empty() and len(w.got[0]) == 2, "r0 and r2")
        for _ in range(5):
            w.worker.loop_once()
            w.read()
        assert w.got[0] == ["r0", "r2"]
    finally:
        w.close()


def test_a_restarted_router_removes_its_predecessors_waiting_prefixes(tokenizer_512):
    """Router 5's r1 waits in the outbox (r0 went to the socket) and its r3 is queued; router
    7's RouterHello drops both, and a later request of router 5 is dropped as it comes: the
    decode worker gets r0, then router 7's r2 and r5."""
    w = Worker(make_config(tokenizer_512, "processes"), "prefill_to_decode_hwm=1")
    try:
        w.worker.on_router_hello(protocol.RouterHello(5), [])
        w.worker.prefill(request("r0", router=5))
        w.worker.prefill(request("r1", router=5))
        w.worker.prefill(request("r2", router=7))
        w.worker.on_generate(request("r3", router=5), [])
        assert w.worker.outbox.counts() == [2] and len(w.worker.queue) == 1
        w.worker.on_router_hello(protocol.RouterHello(7), [])
        assert w.worker.outbox.counts() == [1] and not w.worker.queue
        w.worker.on_generate(request("r4", router=5), [])
        w.worker.on_generate(request("r5", router=7), [])
        assert [r.request_id for r in w.worker.queue] == ["r5"]
        w.bind(0)
        w.until(lambda: len(w.got[0]) == 3, "r0, r2 and r5")
        for _ in range(5):
            w.worker.loop_once()
            w.read()
        assert w.got[0] == ["r0", "r2", "r5"]
    finally:
        w.close()


# ---- the router's stall bound: a prefix waiting in an outbox is on its way, not lost ----

STALL = 1.0
ADDRESSES = Addresses("ipc://r", ("ipc://p",), ("ipc://d",), ("ipc://k",))


def prefill_beat(outbox: list[int]) -> Heartbeat:
    load = PrefillLoad(0, 0, 1, 0, Histogram().snapshot(), last_seq=100, outbox=outbox)
    return Heartbeat("prefill", 0, 1, PROTOCOL_VERSION, 0.0, False, TransportCounters(),
                     prefill=load, incarnation="p")  # fmt: skip


def decode_beat() -> Heartbeat:
    h = Histogram().snapshot()
    load = DecodeLoad(8, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, h, h, h)  # no prefix pending there
    return Heartbeat("decode", 0, 2, PROTOCOL_VERSION, 0.0, False, TransportCounters(),
                     decode=load, incarnation="d")  # fmt: skip


def first_token_only(outbox: list[int], prefill_alive: bool = True, prefill_from: int = 0):
    """What the monitor ends after a long pause: one request with the token its prefill
    sent (and prefill_from more before it), decode worker 0 holding no prefix, prefill
    worker 0 reporting `outbox`."""
    workers = WorkerTable(ADDRESSES, 30.0)
    workers.observe(Ready("prefill", 0, 1, PROTOCOL_VERSION, WorkerInfo(), "p"))
    workers.observe(Ready("decode", 0, 2, PROTOCOL_VERSION, WorkerInfo(), "d"))
    workers.observe(prefill_beat(outbox))
    workers.observe(decode_beat())
    if not prefill_alive:
        workers.workers[("prefill", 0)].state = "dead"
    requests = RequestTable(60.0)
    monitor = LivenessMonitor(workers, requests, STALL)
    handle = RequestHandle("r", 5, RequestParams(), 0.0, 0.0, deadline=1e9, last_progress=0.0,
                           prefill_seq=100, prefill_from=prefill_from,
                           completion_tokens=prefill_from + 1)  # fmt: skip
    handle.stamp = Stamp(epoch=0, prefill=0, decode=0, detok=0)
    requests.add(handle)
    return [d.handle.request_id for d in monitor.expire_requests(100 * STALL) if isinstance(d, End)]


def test_a_prefix_waiting_in_an_outbox_is_no_stall():
    assert first_token_only([1]) == []  # its prefix may be the one waiting: not lost
    assert first_token_only([1], prefill_from=3) == []  # a moved request's too
    assert first_token_only([0]) == ["r"]  # nothing waits: the stall bound holds
    assert first_token_only([1], prefill_alive=False) == ["r"]  # it died with its prefill worker


# ---- through the real processes ----


def test_a_burst_of_streams_to_a_decode_worker_slow_to_read_all_complete(tokenizer_512):
    """32 streams, 16 at a time, to a stack whose decode worker steps slowly and whose prefill
    worker's socket to it queues one prefix (its outbox holds at most one byte's worth, so
    requests also wait unprefilled): every stream is the fake engine's whole output. Bursts
    repeat until the prefill worker has reported a prefix that had to wait (the event under
    test happened), each checked in full."""
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, "processes",
                         model={"fake_step_s": 0.005, "fake_prefill_s": 0.005})  # fmt: skip
    faults = "prefill_to_decode_hwm=1,prefill_to_decode_outbox_bytes=1"
    env = {**os.environ, "SPLITSERVE_FAULTS": faults}
    rng = random.Random(5)
    words = ["hello", "world", "stream", "order", "token", "data", "naïve", "東京"]
    params = RequestParams(max_tokens=24, ignore_eos=True)

    async def one(core, prompt: list[int], gate: asyncio.Semaphore) -> None:
        async with gate:
            handle = await core.submit(prompt, params)
            text, result = await handle.finished()
        tokens, _ = expected_fake_tokens(prompt, tok.vocab_size, 24, ignore_eos=True)
        assert (result.finish_reason, result.error) == (FinishReason.LENGTH, "")
        assert text == tok.decode(tokens, skip_special_tokens=True)

    def prefill_load(core) -> PrefillLoad | None:
        return core.workers.workers[("prefill", 0)].load

    async def body():
        async with pipeline(config, env=env) as (core, _):
            submitted = 0
            for _ in range(10):
                prompts = [tok.encode(" ".join(rng.choices(words, k=8))) for _ in range(32)]
                gate = asyncio.Semaphore(16)
                await asyncio.gather(*(one(core, p, gate) for p in prompts))
                submitted += len(prompts)
                # a report taken after every one of them was prefilled
                await wait_for(lambda n=submitted: prefill_load(core).prefills >= n,
                               DEADLINE_S, "the prefill worker's report")  # fmt: skip
                if prefill_load(core).outbox_waited:
                    return
            raise AssertionError("no prefix ever waited: the test did not test the outbox")

    run(body(), timeout_s=240)
