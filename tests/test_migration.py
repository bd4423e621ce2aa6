"""No stream lost: with real worker processes and the fake engine, every in-flight stream survives
the SIGKILL (or a SIGSTOP past the liveness timeout, then SIGCONT) of any one worker, and ends with
exactly the text and tokens of an undisturbed run: nothing lost, nothing repeated, in order.

The kill lands for sure mid-stream: the worker is frozen (SIGSTOP) first, with every stream under
way (for the prefill worker: with every request in its queue), so that none can end before it
dies. The fake engine's arithmetic is deterministic, so 'undisturbed' is worked out by hand
(expected_fake_tokens); a resumed prefill samples exactly as the decode step would have.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from router.requests import RequestParams
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import expected_fake_tokens, make_config, pipeline, run, wait_for

pytestmark = pytest.mark.slow

STREAMS = 32
MAX_TOKENS = 120


def _prompts(tok, n: int) -> list[list[int]]:
    words = ["hello", "naïve", "東京", "🙂", "stream", "über", "order"]
    return [tok.encode(" ".join(words[i % 7:] + words[: i % 5]) + f" {i}") for i in range(n)]


async def _kill_mid_stream(core, stack, role: str, how: str, prompts, tok) -> None:
    """Submit the streams and take `role`'s worker down with each of them certainly in flight."""
    params = RequestParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    victim = stack.children[(role, 0)].popen
    if role == "prefill":  # every request waits in the frozen prefill worker's queue
        victim.send_signal(signal.SIGSTOP)
        handles = [await core.submit(p, params) for p in prompts]
    else:  # every stream under way, then frozen where it is: none can end before the kill
        handles = [await core.submit(p, params) for p in prompts]
        await wait_for(lambda: all(h.completion_tokens >= 2 for h in handles), 60, "streams")
        victim.send_signal(signal.SIGSTOP)
    if how == "kill":
        stack.kill(role, 0)
    try:
        # the router notices (heartbeats stop) and moves what depended on the worker
        await wait_for(lambda: core.workers.get(role, 0).state == "dead", 30, f"{role} dead")
    finally:
        if how == "stop":
            victim.send_signal(signal.SIGCONT)
    if how == "kill":
        stack.restart(role, 0)
    results = await asyncio.wait_for(asyncio.gather(*(h.finished() for h in handles)), 120)
    for prompt, handle, (text, result) in zip(prompts, handles, results, strict=True):
        tokens, _ = expected_fake_tokens(prompt, tok.vocab_size, MAX_TOKENS, ignore_eos=True)
        assert result.finish_reason.api == "length", (handle.request_id, result)
        assert list(handle.token_ids) == tokens, handle.request_id
        assert text == tok.decode(tokens, skip_special_tokens=True), handle.request_id
        if role != "detok" or handle.migrations:  # a detok worker holds only its own streams
            assert handle.migrations == 1, handle.request_id
    assert any(h.migrations for h in handles)


@pytest.mark.parametrize("how", ["kill", "stop"])
@pytest.mark.parametrize("role", ["detok", "decode", "prefill"])
def test_every_stream_survives_one_worker(tokenizer_512, role, how):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        model={
            "num_slots": STREAMS,
            "fake_step_s": 0.02,
        },
        router={"max_running": STREAMS},
    )
    prompts = _prompts(tok, STREAMS)

    async def body():
        async with pipeline(config) as (core, stack):
            await _kill_mid_stream(core, stack, role, how, prompts, tok)
            # the worker is back (restarted, or woken) and serves new requests
            await wait_for(lambda: core.workers.get(role, 0).state == "ready", 60, "rejoined")
            again = await core.submit(prompts[0], RequestParams(max_tokens=5, ignore_eos=True))
            _, result = await again.finished()
            assert result.finish_reason.api == "length"

    run(body(), timeout_s=300)


def test_past_the_migration_limit_a_request_ends_with_a_clear_error(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512, model={"fake_step_s": 0.02}, router={"max_migrations": 0}
    )

    async def body():
        async with pipeline(config) as (core, stack):
            params = RequestParams(max_tokens=400, ignore_eos=True)
            handles = [await core.submit(tok.encode("doomed"), params) for _ in range(4)]
            await wait_for(lambda: all(h.completion_tokens for h in handles), 30, "streams")
            stack.kill("decode", 0)
            for _, result in await asyncio.gather(*(h.finished() for h in handles)):
                assert result.finish_reason.api == "error"
                assert "decode worker 0 died" in result.error and "moved 0 times" in result.error

    run(body(), timeout_s=120)


def test_streams_that_wait_longer_than_the_stall_timeout_for_a_worker_still_complete(
    tokenizer_512,
):
    """The only decode worker is dead for longer than stall_timeout_s before it is back: the
    requests wait for it (bounded by migration_timeout_s, not by the stall check), and then
    queue for their re-prefill longer than stall_timeout_s too (half a second each, one after
    another): they complete exactly. (Their stall clock used to keep their last token from before
    the wait, and a queued re-prefill counted as a stall: each ended 'no progress'.)"""
    tok = load_tokenizer(tokenizer_512)
    stall_s = 2.0
    config = make_config(
        tokenizer_512,
        model={"num_slots": 8, "fake_step_s": 0.02, "fake_prefill_s": 0.5, "max_seq_len": 1024},
        router={"max_running": 8, "stall_timeout_s": stall_s},
    )
    prompts = _prompts(tok, 8)
    params = RequestParams(max_tokens=600, ignore_eos=True)  # 12 s of steps: none ends first

    async def body():
        async with pipeline(config) as (core, stack):
            handles = [await core.submit(p, params) for p in prompts]
            await wait_for(lambda: all(h.completion_tokens >= 2 for h in handles), 60, "streams")
            stack.children[("decode", 0)].popen.send_signal(signal.SIGSTOP)
            stack.kill("decode", 0)
            await wait_for(lambda: all(h.waiting_since is not None for h in handles), 60,
                           "every request waiting for a decode worker")  # fmt: skip
            await asyncio.sleep(3 * stall_s)  # the wait outlasts the stall timeout, surely
            stack.restart("decode", 0)
            results = await asyncio.wait_for(asyncio.gather(*(h.finished() for h in handles)), 120)
            for prompt, handle, (text, result) in zip(prompts, handles, results, strict=True):
                tokens, _ = expected_fake_tokens(prompt, tok.vocab_size, 600, ignore_eos=True)
                assert result.finish_reason.api == "length", (handle.request_id, result)
                assert list(handle.token_ids) == tokens, handle.request_id
                assert text == tok.decode(tokens, skip_special_tokens=True), handle.request_id

    run(body(), timeout_s=300)


def test_a_move_off_a_draining_worker_does_not_count_against_the_limit(tokenizer_512):
    """max_migrations 0: any move a worker's loss forces ends the request. The stream's detok
    worker is stopped on purpose (SIGTERM: it drains), which is the operator's doing: the stream
    moves to the other detok worker and ends whole. The decode worker is frozen across the drain,
    so the stream is certainly in flight while it happens (and the liveness timeout is long, so
    the frozen worker is not taken for dead)."""
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512, model={"fake_step_s": 0.02}, router={"max_migrations": 0},
        lifecycle={"liveness_timeout_s": 600.0},
    )  # fmt: skip
    prompt, max_tokens = tok.encode("drained"), 200

    async def body():
        async with pipeline(config) as (core, stack):
            params = RequestParams(max_tokens=max_tokens, ignore_eos=True)
            handle = await core.submit(prompt, params)
            await wait_for(lambda: handle.completion_tokens >= 2, 60, "the stream under way")
            first = handle.stamp.detok
            decode = stack.children[("decode", 0)].popen
            decode.send_signal(signal.SIGSTOP)
            try:  # the draining worker exits once the router has moved its stream off it
                await asyncio.to_thread(stack.kill, "detok", first, signal.SIGTERM)
            finally:
                decode.send_signal(signal.SIGCONT)
            text, result = await asyncio.wait_for(handle.finished(), 240)
            tokens, _ = expected_fake_tokens(prompt, tok.vocab_size, max_tokens, ignore_eos=True)
            assert result.finish_reason.api == "length", result
            assert handle.stamp.detok != first and handle.migrations == 1
            assert list(handle.token_ids) == tokens
            assert text == tok.decode(tokens, skip_special_tokens=True)

    run(body(), timeout_s=300)
