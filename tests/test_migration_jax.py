"""Streams survive a worker's death with the real JAX engine (a tiny random Llama), 32 concurrent
greedy streams: each one ends with all its tokens, its text is exactly the detokenization of the
token ids the client received (no byte lost or repeated), and its tokens equal an undisturbed
run's up to the point where it moved. After a move the engine's arithmetic may round differently
(a prompt re-prefilled as one pass against decode steps one by one): how often a continuation
differs is printed for the record, not asserted (a property of the float arithmetic, not of the
pipeline)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from router.requests import RequestParams
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import make_config, pipeline, run, wait_for

pytestmark = pytest.mark.slow

STREAMS = 32
MAX_TOKENS = 200


@pytest.mark.parametrize("role", ["detok", "decode", "prefill"])
def test_jax_streams_survive_a_killed_worker(tokenizer_512, role):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        model={"engine": "jax", "path": "random:test-tiny", "num_slots": STREAMS,
               "max_seq_len": 256},
        # the frozen streams make no progress until the restart is noticed: not a stall here
        router={"max_running": STREAMS, "stall_timeout_s": 600.0},
        lifecycle={"liveness_timeout_s": 600.0},
    )  # fmt: skip
    prompts = [tok.encode(f"stream {i} of many: ünïcode 東京") for i in range(STREAMS)]
    params = RequestParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    async def body():
        async with pipeline(config, ready_s=400) as (core, stack):
            calm = [await core.submit(p, params) for p in prompts]
            await asyncio.gather(*(h.finished() for h in calm))
            undisturbed = [list(h.token_ids) for h in calm]

            # Nothing can pass its first token before the kill: the decode worker is frozen
            # before the requests come (for the prefill worker's kill, the prefill worker:
            # every request then waits in its queue). The router learns of the kill from the
            # restarted worker's Ready (a new incarnation), not from a timeout, so the frozen
            # decode worker is not taken for dead meanwhile (liveness_timeout_s is long).
            decode = stack.children[("decode", 0)].popen
            frozen = stack.children[(role, 0)].popen if role == "prefill" else decode
            frozen.send_signal(signal.SIGSTOP)
            handles = [await core.submit(p, params) for p in prompts]
            if role != "prefill":
                await wait_for(lambda: all(h.completion_tokens for h in handles), 240, "tokens")
            reached = [h.completion_tokens for h in handles]
            restarts = core.workers.get(role, 0).restarts
            stack.kill(role, 0)
            stack.restart(role, 0)
            await wait_for(lambda: core.workers.get(role, 0).restarts > restarts, 300, "noticed")
            if role == "detok":
                decode.send_signal(signal.SIGCONT)
            results = await asyncio.wait_for(
                asyncio.gather(*(h.finished() for h in handles)), 240
            )
            differ = 0
            for h, (text, result), calm_ids, n in zip(
                handles, results, undisturbed, reached, strict=True
            ):
                ids = list(h.token_ids)
                assert result.finish_reason.api == "length" and len(ids) == MAX_TOKENS, result
                assert text == tok.decode(ids, skip_special_tokens=True), h.request_id
                assert ids[:n] == calm_ids[:n], h.request_id  # the same up to the move
                differ += ids != calm_ids
            moved = sum(h.migrations > 0 for h in handles)
            assert moved
            print(f"\n{role}: {moved} of {STREAMS} streams moved; {differ} continued differently")

    run(body(), timeout_s=800)  # under the suite timeout (900 s): the warm-up compiles the
    # batched prefill and 4-step decode programs too, minutes on a busy 2-core host
