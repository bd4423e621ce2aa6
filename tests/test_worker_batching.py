"""The workers' batching changes no output: a burst through the batched prefill and the
multi-step decode ([model] prefill_batch_tokens, decode_steps) gives every request exactly the
tokens and finish it gets with one prompt a call and one step a dispatch, with the real JAX
engine (a tiny random Llama) in the threads-mode pipeline: greedy and seeded, max_tokens that end
inside a chunk; and an abort mid-stream (the fake engine) that leaves every slot free."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from prefill_worker.worker import PrefillWorker
from router.requests import RequestParams
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import (
    expected_fake_tokens,
    make_config,
    pipeline,
    programs_compiled,
    run,
    wait_for,
)

# two pipelines, each compiling its programs: minutes on a busy 2-core host
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SLOTS = 8
CHUNK = 4
# 1: finished at prefill; 2, 6, 7, 9: inside a chunk of 4 steps; 5, 13: at a chunk's end
MAX_TOKENS = [1, 2, 5, 6, 7, 9, 13, 24, 6, 7, 9, 13, 24, 2, 5, 24]
# the aborted request's max_tokens: at 50 ms a step it needs over a minute to end by itself, and
# it is cut after 10 tokens
LONG = 1500
GATHER_S = 120.0  # the most the first prefill pass waits for a second request


def _config(tokenizer: str, prefill_tokens: int, steps: int):
    return make_config(
        tokenizer,
        "threads",
        model={"engine": "jax", "path": "random:test-tiny", "num_slots": SLOTS,
               "max_seq_len": 64, "prefill_batch_tokens": prefill_tokens,
               "decode_steps": steps, "decode_steps_max_live": SLOTS},
        router={"max_running": 32},
        lifecycle={"liveness_timeout_s": 5.0},
    )  # fmt: skip


def _params(i: int) -> RequestParams:
    if i % 2:
        return RequestParams(max_tokens=MAX_TOKENS[i], temperature=0.9, top_k=40, seed=100 + i,
                             ignore_eos=True)  # fmt: skip
    return RequestParams(max_tokens=MAX_TOKENS[i], temperature=0.0, ignore_eos=True)


async def _stream(handle, cut_after: int | None = None):
    ids: list[int] = []
    async for delta in handle:
        ids.extend(delta.token_ids)
        if cut_after is not None and len(ids) >= cut_after:
            return ids, handle
    return ids, handle


def _serve(config, prompts):
    """(ids, finish) of each prompt sent at once, and the workers' batching figures."""

    async def body():
        async with pipeline(config, ready_s=480) as (core, stack):
            await programs_compiled(core)  # the 4-step programs come after Ready (cold)
            handles = [await core.submit(p, _params(i)) for i, p in enumerate(prompts)]
            streams = await asyncio.gather(*(_stream(h) for h in handles))
            burst = [(ids, h.result.finish_reason.api) for ids, h in streams]
            prefill = next(w for w in stack.workers if w.role == "prefill")
            decode = next(w for w in stack.workers if w.role == "decode")
            return burst, prefill.batched_calls, decode.chunks

    return run(body(), timeout_s=800)


def gather_first_pass(monkeypatch) -> None:
    """The prefill worker's first pass waits until two requests are in its queue, so a call of
    more than one prompt happens for sure, however the host schedules the burst's sends (the
    real loop, only held at its start; threads mode runs it in this process)."""
    original = PrefillWorker.loop_once
    gathered = threading.Event()

    def loop_once(self):
        deadline = time.monotonic() + GATHER_S
        while (not gathered.is_set() and len(self.queue) < 2 and not self.stop.is_set()
               and time.monotonic() < deadline):  # fmt: skip
            self.dispatch(self.receive(wait=True))  # blocks for a message, at most ~50 ms
            self.maybe_snapshot()  # heartbeats carry fresh load meanwhile
        if self.queue:
            gathered.set()
        original(self)

    monkeypatch.setattr(PrefillWorker, "loop_once", loop_once)


def test_batched_prefill_and_chunked_decode_give_the_same_streams(tokenizer_512, monkeypatch):
    tok = load_tokenizer(tokenizer_512)
    words = ["hello", "world", "東京", "stream", "order", "token", "data", "naïve"]
    prompts = [tok.encode(" ".join(words[(i + j) % len(words)] for j in range(1 + i % 5)))
               for i in range(len(MAX_TOKENS))]  # fmt: skip
    assert max(len(p) for p in prompts) + max(MAX_TOKENS) <= 64
    one_at_a_time = _serve(_config(tokenizer_512, 0, 1), prompts)
    gather_first_pass(monkeypatch)
    batched = _serve(_config(tokenizer_512, 64, CHUNK), prompts)
    assert one_at_a_time[1] == 0 and one_at_a_time[2] == 0  # the reference never batched
    # the burst did run batched (the first pass held for two) and chunked (after the last
    # insert nothing is pending, and every inserted request has a decode step left)
    assert batched[1] > 0 and batched[2] > 0
    assert batched[0] == one_at_a_time[0]
    for (ids, finish), n in zip(batched[0], MAX_TOKENS, strict=True):
        assert finish == "length" and len(ids) == n


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_an_abort_inside_chunks_ends_the_stream_and_frees_the_slot(tokenizer_512, mode):
    """The fake engine at 50 ms a step (its generate_many: the interface's k single steps), so
    the abort lands mid-stream: the stream ends with abort, its tokens so far exact."""
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, mode, model={"fake_step_s": 0.05, "decode_steps": CHUNK,
                                                     "max_seq_len": 2048})  # fmt: skip
    prompt = tok.encode("an aborted stream")

    async def body():
        async with pipeline(config) as (core, _):
            params = RequestParams(max_tokens=LONG, ignore_eos=True)
            ids, h = await _stream(await core.submit(prompt, params), cut_after=10)
            core.abort(h)
            await h.finished()
            assert h.result.finish_reason.api == "abort" and 10 <= len(ids) < LONG
            full, _ = expected_fake_tokens(prompt, tok.vocab_size, LONG, ignore_eos=True)
            assert ids == full[:len(ids)]

            def slots_free():
                loads = [w.load for w in core.workers.workers.values() if w.role == "decode"]
                return all(ld is not None and ld.free_slots == ld.num_slots for ld in loads)

            await wait_for(slots_free, 60, "every decode slot free after the abort")

    run(body(), timeout_s=240)
