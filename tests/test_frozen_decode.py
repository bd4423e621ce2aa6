"""A frozen decode worker does not hold up the prefill worker: with real processes (1 prefill,
2 decode workers, the fake engine), decode 1 is stopped (SIGSTOP) and the router is kept from
noticing (long liveness and stall timeouts), so that it goes on placing prefixes there. The one
prefill worker sends decode 1 megabytes of prefixes it does not read, far beyond what the
socket buffers between them hold, and must still prefill every request placed on decode 0 after
them, each of which streams its full decode. Its sends never block (splitserve/transport.py):
a prefix for a peer that does not read waits in ZeroMQ's queue, or is dropped and counted once
that queue is at its high-water mark. Once decode 1 is let go (SIGCONT), each of its requests
ends (today every one completes), and those that complete equal the full decode too."""

from __future__ import annotations

import asyncio
import signal

import pytest

from router.requests import RequestParams
from tests.pipeline_util import expected_fake_tokens, make_config, pipeline, run, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VOCAB = 512
PROMPT_TOKENS = 15_000  # the fake's KV is 4 bytes a token: 60 kB a prefix
SLOTS = (16, 48)  # decode 1 holds 48 prefixes, 2.9 MB, before the router counts it full
WAVES = 3  # of requests submitted once decode 1 is full, each all on decode 0
MAX_TOKENS = 16
STALL_S = 180.0


def _prompt(i: int) -> list[int]:
    return [(i * 7 + j) % VOCAB for j in range(PROMPT_TOKENS)]


def _assert_full_decode(i: int, handle, result) -> None:
    tokens, _ = expected_fake_tokens(_prompt(i), VOCAB, MAX_TOKENS, ignore_eos=True)
    assert result.finish_reason.api == "length", (handle.request_id, result)
    assert list(handle.token_ids) == tokens


def test_a_frozen_decode_worker_does_not_block_the_prefill_worker(tokenizer_512):
    config = make_config(
        tokenizer_512,
        model={"max_seq_len": PROMPT_TOKENS + 1024, "num_slots": 16},
        cluster={"decode_workers": 2, "decode_slots": list(SLOTS)},
        # the router must not see decode 1 go: it keeps placing prefixes there, so prefill keeps
        # sending to a peer that reads nothing; the stall timeout outlasts the freeze (seconds)
        # and still bounds the life of a request whose prefix never arrived
        lifecycle={"heartbeat_interval_s": 0.1, "liveness_timeout_s": 600.0},
        router={"max_running": 128, "max_queued": 128, "stall_timeout_s": STALL_S,
                "queue_timeout_s": 600.0},  # fmt: skip
    )
    params = RequestParams(max_tokens=MAX_TOKENS, ignore_eos=True)

    async def _full_decodes(handles) -> None:
        """Every (prompt index, handle) streams its full decode."""
        results = await asyncio.wait_for(asyncio.gather(*(h.finished() for _, h in handles)), 120)
        for (i, h), (_, result) in zip(handles, results, strict=True):
            _assert_full_decode(i, h, result)

    async def body():
        async with pipeline(config) as (core, stack):
            frozen = stack.children[("decode", 1)].popen
            frozen.send_signal(signal.SIGSTOP)
            try:
                # requests until decode 1 is full (those on decode 0 meanwhile may end, which
                # only changes how many of them there are)
                first: list = []
                while sum(h.stamp.decode == 1 for h in first) < SLOTS[1]:
                    assert len(first) < 4 * SLOTS[1], "decode 1 never filled"
                    first.append(await core.submit(_prompt(len(first)), params))
                on_frozen = [(i, h) for i, h in enumerate(first) if h.stamp.decode == 1]
                await _full_decodes([(i, h) for i, h in enumerate(first) if h.stamp.decode == 0])
                # decode 0 has room again and decode 1 is full: each wave of as many requests
                # as decode 0 has slots goes to decode 0, through the prefill worker that sent
                # decode 1 what it does not read (one more would tie the full two: either)
                for wave in range(WAVES):
                    start = len(first) + wave * SLOTS[0]
                    later = [(i, await core.submit(_prompt(i), params))
                             for i in range(start, start + SLOTS[0])]  # fmt: skip
                    assert all(h.stamp.decode == 0 for _, h in later)
                    await _full_decodes(later)
                assert frozen.poll() is None  # still there, still stopped
                # nothing placed on decode 1 completed (a dropped prefix may have ended in error)
                completed = [h for _, h in on_frozen if h.result is not None
                             and h.result.finish_reason.api == "length"]  # fmt: skip
                assert completed == []
            finally:
                frozen.send_signal(signal.SIGCONT)
            # let go, decode 1 takes what reached it: each of its requests ends; what completes
            # is its full decode (one whose prefix was dropped at the high-water mark ends in
            # an error, at the latest at the stall timeout)
            ended = lambda: all(h.result is not None for _, h in on_frozen)  # noqa: E731
            await wait_for(ended, STALL_S + 60, "decode 1's requests to end")
            for i, h in on_frozen:
                _, result = await h.finished()
                if result.finish_reason.api == "length":
                    _assert_full_decode(i, h, result)

    run(body(), timeout_s=STALL_S + 300)
