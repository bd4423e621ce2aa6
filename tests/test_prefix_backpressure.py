"""A dead decode worker cannot make the prefill worker grow without bound, nor lose requests in
silence (issue 16): the prefix sender queues about PREFIX_QUEUE_BYTES of the largest prefixes,
then drops, and each dropped prefix fails its request to the router. Real sockets over ipc; the
decode worker's address has no one bound to it."""

from __future__ import annotations

import threading
import time

import zmq

from prefill_worker.worker import PrefillWorker
from splitserve.engine.interface import SamplingParams
from splitserve.message_limits import (
    HEADER_MARGIN_BYTES,
    PREFIX_QUEUE_BYTES,
    prefix_send_hwm,
)
from splitserve.protocol import (
    DetokParams,
    GenerateRequest,
    RequestFailed,
    StopCriteria,
    TransportCounters,
)
from splitserve.transport import SEND_HWM, Receiver, Sender
from tests.default_shape import default_model_shape
from tests.pipeline_util import make_config

DEADLINE_S = 60.0


def test_the_default_models_prefix_queue_holds_about_a_gib(tokenizer_512):
    config = make_config(tokenizer_512, model={"max_seq_len": 2048})
    per_token = default_model_shape().kv_bytes_per_token(4)  # SmolLM2-135M, a float32 cache
    hwm = prefix_send_hwm(config, per_token)
    assert hwm == 11  # not the 100,000 of the control senders: 9 TB of prefixes
    assert hwm * (per_token * 2048 + HEADER_MARGIN_BYTES) <= PREFIX_QUEUE_BYTES
    huge = prefix_send_hwm(config, per_token * 100)
    assert huge == 2  # a model whose prefix alone is over the budget still queues two
    assert prefix_send_hwm(config, 0) < SEND_HWM


def test_a_sender_to_no_one_queues_its_hwm_then_drops(tmp_path):
    ctx = zmq.Context()
    counters = TransportCounters()
    sender = Sender(ctx, f"ipc://{tmp_path}/nobody.sock", counters, hwm=3)
    try:
        sent = [sender.send(RequestFailed([f"r{i}"], [0], "prefill", "x")) for i in range(6)]
        assert sent == [True] * 3 + [False] * 3
        assert (counters.sent, counters.dropped) == (3, 3)
    finally:
        sender.close()
        ctx.destroy(linger=0)


def request(rid: str) -> GenerateRequest:
    return GenerateRequest(
        rid, 0, 0, 1, [5, 6, 7], 0, SamplingParams(), StopCriteria(max_tokens=8), DetokParams(),
    )  # fmt: skip


def test_prefixes_for_a_dead_decode_worker_fail_their_requests(tokenizer_512):
    config = make_config(tokenizer_512, "processes")
    ctx = zmq.Context()
    router = Receiver(ctx, config.addresses.router, TransportCounters())
    worker = PrefillWorker(config, 0, ctx, threading.Event(), {})
    try:
        hwm = prefix_send_hwm(config, worker.engine.kv_bytes_per_token)
        assert hwm < SEND_HWM
        total = hwm + 5
        for i in range(total):
            worker.prefill(request(f"r{i}"))
        failed: dict[str, str] = {}
        deadline = time.monotonic() + DEADLINE_S
        while len(failed) < total - hwm and time.monotonic() < deadline:
            router.poll(100)
            for msg, _ in router.drain():
                if isinstance(msg, RequestFailed):
                    failed.update(dict.fromkeys(msg.request_ids, msg.message))
        # the first hwm prefixes wait in the queue (for a decode worker that may yet come);
        # every later one is refused by it, and its request failed, none lost in silence
        assert sorted(failed, key=lambda r: int(r[1:])) == [f"r{i}" for i in range(hwm, total)]
        assert all("decode worker 0 slow or gone" in m for m in failed.values())
        assert worker.counters.dropped == total - hwm
    finally:
        worker.shutdown()
        router.close()
        ctx.destroy(linger=0)
