"""Failure behaviour with real processes, with request migration turned off (max_migrations = 0;
tests/test_migration.py has it on): a SIGKILLed worker ends the requests that depended on it with
an error, new requests avoid a dead detok worker or wait while a worker is replaced, and a
restarted worker resumes service without restarting the others. Malformed wire messages are
counted, never fatal."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from router.core import RouterCore
from router.inbox import READ_BATCH
from router.requests import NotReady, RequestParams
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import make_config, pipeline, run, wait_for

pytestmark = pytest.mark.slow


async def _stream_all(handles):
    return await asyncio.gather(*(h.finished() for h in handles))


@pytest.mark.parametrize("role", ["detok", "decode", "prefill"])
def test_killed_worker_fails_its_requests_then_service_resumes(tokenizer_512, role):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        model={"fake_step_s": 0.02, "fake_prefill_s": 0.05 if role == "prefill" else 0.0},
        router={"max_migrations": 0, "queue_timeout_s": 1.0},
    )
    prompt = tok.encode("hello world")

    async def body():
        async with pipeline(config) as (core, stack):
            params = RequestParams(max_tokens=400, ignore_eos=True)
            handles = [await core.submit(prompt, params) for _ in range(8)]
            # mid-stream: tokens are flowing (with a slow prefill, most still wait there)
            await wait_for(lambda: any(h.completion_tokens for h in handles), 30, "first tokens")
            victims = [h for h in handles if role != "detok" or h.detok_index == 0]
            stack.kill(role, 0)
            results = await asyncio.gather(*(h.finished() for h in handles))
            for h, (_, r) in zip(handles, results, strict=True):
                if h in victims and (role != "prefill" or r.completion_tokens == 0):
                    assert r.finish_reason.api == "error", (h.request_id, r)
                    assert f"{role} worker 0 died" in r.error
                else:
                    assert r.finish_reason.api in ("length", "error")

            if role == "detok":  # new requests go to the live detok worker only
                for _ in range(6):
                    h = await core.submit(prompt, RequestParams(max_tokens=5))
                    assert h.detok_index == 1
                    _, r = await h.finished()
                    assert r.finish_reason.api in ("stop", "length")
            else:  # no full pipeline: it waits for the worker's replacement, then is refused
                await wait_for(lambda: not core.is_ready(), 5, "pipeline not ready")
                with pytest.raises(NotReady, match="being replaced"):
                    await core.submit(prompt, RequestParams(max_tokens=5))

            others = {c.popen.pid for k, c in stack.children.items() if k != (role, 0)}
            stack.restart(role, 0)
            await wait_for(
                lambda: core.is_ready() and len(core.workers.live_detoks()) == 2, 60, "recovery"
            )
            handles = [await core.submit(prompt, RequestParams(max_tokens=20)) for _ in range(8)]
            for _, r in await _stream_all(handles):
                assert r.finish_reason.api in ("stop", "length")
            assert others == {c.popen.pid for k, c in stack.children.items() if k != (role, 0)}
            assert {h.detok_index for h in handles} == {0, 1} or role != "detok"

    run(body(), timeout_s=180)


def test_malformed_messages_are_counted_not_fatal(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512)
    garbage = [
        [b""],
        [b"\xff"],
        [b"\x01not msgpack"],
        [b"\x01\x93\x01\x02\x03"],  # a GenerateRequest with three fields of the wrong types
        [
            b"\x03\x98\x01\x02\x91\xa1x\x91\x01\x91\x01\x91\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x91\x00"
        ],
        [b"\x02" + b"\x98" + b"\xa1x" * 8, b"junk frame"],
    ]

    async def body():
        async with pipeline(config) as (core, _):
            ctx = zmq.Context()
            try:
                a = config.addresses
                for endpoint in [*a.prefill, *a.decode, *a.detok]:
                    s = ctx.socket(zmq.PUSH)
                    s.setsockopt(zmq.LINGER, 0)
                    s.connect(endpoint)
                    for frames in garbage:
                        s.send_multipart(frames)
                    s.close(linger=1000)
            finally:
                ctx.term()

            def counted():
                return all(
                    w.transport.malformed >= 4
                    for w in core.workers.workers.values()
                )

            await wait_for(counted, 10, "malformed messages counted by every worker")
            text, r = await (
                await core.submit(tok.encode("still serving"), RequestParams())
            ).finished()
            assert r.finish_reason.api in ("stop", "length")
            assert core.is_ready()

    run(body())


def test_lost_prefix_ends_with_error_after_stall_timeout(tokenizer_512):
    """A request whose prefix is lost (as in a crash between prefill's two sends) still ends: token
    0 arrives, then nothing, and the router's stall backstop ends it with an error."""
    import os

    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, router={"stall_timeout_s": 1.0})
    env = {**os.environ, "SPLITSERVE_FAULTS": "prefill_to_decode_drop=1"}

    async def body():
        async with pipeline(config, env=env) as (core, _):
            h = await core.submit(tok.encode("lost"), RequestParams(max_tokens=50))
            text, r = await h.finished()
            assert r.finish_reason.api == "error" and "no progress" in r.error
            assert r.completion_tokens == 1

    run(body())


def test_router_reads_a_flood_of_worker_messages_to_the_end(tokenizer_512):
    """More messages at once than the router handles per pass of its event loop: every one is
    read (the malformed counted). No worker runs, so no heartbeat stirs the socket: only the
    router's own return on its next pass reads past the first batch."""
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512)
    flood = 3 * READ_BATCH + 7

    async def body():
        core = RouterCore(config, tok.vocab_size, tok.eos_ids)
        ctx = zmq.Context()
        try:
            await core.start()
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(config.addresses.router)
            for i in range(flood):
                s.send_multipart([b"\x04" + bytes([0x91, i % 100])])  # TextBatch, bad delta
            s.close(linger=1000)
            await wait_for(lambda: core.counters.malformed >= flood, 10,
                           "every malformed message counted")  # fmt: skip
            assert core.counters.malformed == core.counters.received == flood
        finally:
            await core.close()
            ctx.term()

    run(body())
