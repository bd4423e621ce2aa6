"""A request that never gets its first token ends in bounded time, not at request_timeout_s: once
the prefill worker has shown that the request left it (an empty queue at or past the request's
send sequence number; a Fence makes it show that for a request lost as the last message sent),
its token has stall_timeout_s to come. A prefill that is merely slow, or a queue at the prefill
worker, is not a loss, however busy the machine (tests/test_first_token_proof.py has the rule on a
clock of its own). Real worker processes (the fake engine) and a router core on the test's event
loop."""

from __future__ import annotations

import asyncio

import pytest

from router.requests import RequestParams
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import make_config, pipeline, run

pytestmark = pytest.mark.timeout(180)
# what these tests bound is the first token, not the workers' liveness
NEVER_DEAD = {"liveness_timeout_s": 3600.0}


def test_a_request_lost_before_prefill_ends_with_an_error(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    # 5 s: what a first token has, once its request has left the prefill worker, to come through
    # the detok worker; a busy machine must not make the healthy request below look lost. The
    # workers never count as dead here: on a starved host their heartbeats came late, the router
    # replaced them and sent the "lost" request again, which then finished (a CI failure)
    config = make_config(tokenizer_512, router={"stall_timeout_s": 5.0}, lifecycle=NEVER_DEAD)

    async def body():
        async with pipeline(config) as (core, _):
            prefill = core.links.senders[("prefill", 0)]
            real_send = prefill.send_frames
            prefill.send_frames = lambda frames: True  # "sent", and lost on the way
            try:
                handle = await core.submit(tok.encode("lost"), RequestParams(max_tokens=5))
            finally:
                prefill.send_frames = real_send
            # request_timeout_s is 600 s: only the first-token bound ends it within this wait
            _, result = await asyncio.wait_for(handle.finished(), 60)
            assert result.finish_reason.api == "error"
            assert "no first token" in result.error
            assert core.admission.running == 0 and len(core.requests) == 0
            # the core goes on serving
            _, result = await (await core.submit(tok.encode("found"), RequestParams())).finished()
            assert result.finish_reason.api in ("stop", "length")

    run(body())


def test_slow_and_queued_prefills_are_not_mistaken_for_losses(tokenizer_512):
    """Three prefills of 4 s wait in line behind each other: the last one's first token comes
    1.2 stall timeouts after it was sent (the queue, not the clock, decides). The stall timeout
    is 10 s because it is also what a first token has to come through the detok worker once its
    request has left the prefill worker: the margin a busy machine needs."""
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512, router={"stall_timeout_s": 10.0}, model={"fake_prefill_s": 4.0},
        lifecycle=NEVER_DEAD,
    )

    async def body():
        async with pipeline(config) as (core, _):
            handles = [
                await core.submit(tok.encode(f"slow {i}"), RequestParams(max_tokens=3))
                for i in range(3)
            ]
            results = await asyncio.wait_for(
                asyncio.gather(*(h.finished() for h in handles)), 120
            )
            for _, r in results:
                assert r.finish_reason.api in ("stop", "length"), r.error

    run(body())
