"""The largest frame each receiver accepts (splitserve/message_limits.py): sized from the model
for the decode worker, from the control messages' own bounds for the others; a peer that sends a
bigger frame is disconnected by ZeroMQ before the process sees any of it, and later messages
still arrive. Real sockets over ipc."""

from __future__ import annotations

import contextlib
import time

import zmq

from router.core import RouterCore
from splitserve import protocol
from splitserve.grammar.specs import MAX_GRAMMAR_CHARS
from splitserve.message_limits import (
    control_message_bytes,
    max_message_bytes,
    stop_strings_bytes,
)
from splitserve.protocol import Abort, GenerateRequest, TransportCounters
from splitserve.protocol.params import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS
from splitserve.tokenizers import load_tokenizer
from splitserve.transport import Receiver
from tests.default_shape import default_model_shape
from tests.pipeline_util import make_config, run


def test_the_decode_limit_holds_a_prefix_of_the_whole_context(tokenizer_512):
    config = make_config(tokenizer_512, model={"max_seq_len": 2048})
    per_token = default_model_shape().kv_bytes_per_token(4)  # a float32 cache
    assert per_token == 46_080  # SmolLM2-135M: 30 layers, 3 KV heads of 64
    limit = max_message_bytes("decode", config, per_token)
    assert limit >= per_token * 2048 > 90e6  # one frame may hold k and v of 2048 tokens
    assert limit < 2 * per_token * 2048  # and not much more


def test_control_limits_hold_the_largest_legal_control_message(tokenizer_512):
    config = make_config(tokenizer_512, model={"max_seq_len": 4096, "num_slots": 64})
    limit = max_message_bytes("prefill", config)
    assert limit == max_message_bytes("router", config) == max_message_bytes("detok", config)
    worst = GenerateRequest(
        "req-" + "f" * 200, 2**31 - 1, 2**31 - 1, 2**31 - 1, [2**31 - 1] * 4096, 2**31 - 1,
        protocol.SamplingParams(0.5, 0.5, 40, 2**62),
        protocol.StopCriteria(4096, 0, False, list(range(64)), list(range(64))),
        protocol.DetokParams(True, ["\U0010ffff" * protocol.MAX_WIRE_STOP_CHARS]
                             * protocol.MAX_WIRE_STOPS),
        True,
        protocol.LogitsControls(
            -2.0, -2.0, 2.0, list(range(2**31 - 1024, 2**31 - 1)), [-99.5] * 1023, 0.5,
            [[2**31 - 1] * MAX_BAD_WORD_TOKENS] * MAX_BAD_WORDS, 20, 20,
        ),
        "\U0010ffff" * MAX_GRAMMAR_CHARS,
    )  # fmt: skip
    (frame,) = protocol.encode(worst)
    assert len(frame) < limit
    # a prompt as long as the context, scored with 20 alternatives a token (echo, on its way
    # to the router)
    scores = protocol.PromptScores([-1.2345678e-3] * 4095, [2**31 - 1] * 4095,
                                   [[2**31 - 1] * 20] * 4095, [[-1.2345678e-3] * 20] * 4095)
    delta = protocol.TextDelta("req-" + "f" * 200, 1, 0, "x", [1], [0.5], prompt_logprobs=scores)
    (frame,) = protocol.encode(protocol.TextBatch([delta]))
    assert len(frame) < limit
    assert stop_strings_bytes() < limit < 8 << 20  # small: a few MiB, never hundreds
    assert control_message_bytes(config) == limit


def test_a_frame_over_the_limit_is_dropped_and_later_messages_arrive(tmp_path):
    endpoint = f"ipc://{tmp_path}/limited.sock"
    ctx = zmq.Context()
    counters = TransportCounters()
    receiver = Receiver(ctx, endpoint, counters, max_message_bytes=64 * 1024)
    sender = ctx.socket(zmq.PUSH)
    sender.setsockopt(zmq.LINGER, 0)
    try:
        assert receiver.socket.getsockopt(zmq.MAXMSGSIZE) == 64 * 1024
        sender.connect(endpoint)
        big = protocol.encode(Abort(["x" * (32 << 20)], [0]))  # 32 MiB in one frame
        sender.send_multipart(big)
        got = []
        deadline = time.monotonic() + 30
        i = 0
        # the sender reconnects after the receiver dropped it: keep sending until one arrives
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(zmq.Again):  # while reconnecting the queue may be full
                sender.send_multipart(protocol.encode(Abort([f"small-{i}"], [0])), zmq.NOBLOCK)
            i += 1
            if receiver.poll(100):
                got = receiver.drain()
        assert got, "no message arrived after the oversized one"
        assert all(m.request_ids[0].startswith("small-") for m, _ in got)
        assert counters.malformed == 0
    finally:
        sender.close(linger=0)
        receiver.close()
        ctx.term()


def test_the_router_receiver_has_its_limit(tokenizer_512):
    config = make_config(tokenizer_512)
    tok = load_tokenizer(tokenizer_512)

    async def body():
        core = RouterCore(config, tok.vocab_size, tok.eos_ids)
        await core.start()
        try:
            limit = core.links.receiver.socket.getsockopt(zmq.MAXMSGSIZE)
            assert limit == max_message_bytes("router", config)
        finally:
            await core.close()

    run(body())


def test_every_worker_receiver_has_its_limit(tokenizer_512):
    """The workers' receivers: decode's from its engine's KV bytes per token
    (the fake engine's: 4), the others' from the control messages' bounds."""
    import threading

    from decode_worker.worker import DecodeWorker
    from detok_worker.worker import DetokWorker
    from prefill_worker.worker import PrefillWorker

    config = make_config(tokenizer_512, "threads")
    ctx = zmq.Context()
    try:
        for cls in (PrefillWorker, DecodeWorker, DetokWorker):
            worker = cls(config, 0, ctx, threading.Event(), {})
            kv = 4 if cls is DecodeWorker else 0
            assert worker.receiver.socket.getsockopt(zmq.MAXMSGSIZE) == max_message_bytes(
                worker.role, config, kv
            )
            worker.shutdown()
    finally:
        ctx.destroy(linger=0)
