"""End-to-end invariants of the pipeline with real processes (and threads), real ZeroMQ sockets and
the fake engine: every stream equals the full decode, order holds under injected delays, finishes
are right, aborts leave nothing behind."""

from __future__ import annotations

import asyncio
import random

import pytest

from router.requests import Overloaded, RequestParams
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import expected_fake_tokens, make_config, pipeline, run, wait_for

MODES = ["processes", "threads"]


def _prompts(tok, n, seed=0):
    rng = random.Random(seed)
    words = ["hello", "world", "naïve", "東京", "🙂", "stream", "order", "token", "über", "data"]
    return [tok.encode(" ".join(rng.choices(words, k=rng.randint(1, 12)))) for _ in range(n)]


@pytest.mark.parametrize("mode", MODES)
def test_streamed_text_equals_full_decode(tokenizer_512, mode):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, mode)

    async def body():
        async with pipeline(config) as (core, _):
            prompts = _prompts(tok, 40)
            handles = []
            for i, p in enumerate(prompts):
                params = RequestParams(max_tokens=5 + (i * 7) % 60, ignore_eos=(i % 2 == 0))
                handles.append((p, params, await core.submit(p, params)))
            results = await asyncio.gather(*(h.finished() for _, _, h in handles))
            for (prompt, params, _), (text, result) in zip(handles, results, strict=True):
                tokens, reason = expected_fake_tokens(
                    prompt, tok.vocab_size, params.max_tokens, tok.eos_ids, params.ignore_eos
                )
                visible = tokens[:-1] if reason == "stop" else tokens
                assert text == tok.decode(visible, skip_special_tokens=True)
                assert result.finish_reason.api == reason
                assert result.completion_tokens == len(tokens)
                assert result.prompt_tokens == len(prompt)

    run(body())


@pytest.mark.parametrize("mode", MODES)
def test_order_holds_when_first_token_is_delayed(tokenizer_512, mode):
    """Token 0 reaches the detok worker ~15 decode steps after token 1; decode batches are also
    delivered in swapped pairs. Every stream must still be complete and in order."""
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, mode, model={"fake_step_s": 0.02})
    faults = {"SPLITSERVE_FAULTS": "prefill_to_detok_delay=0.3,decode_to_detok_reorder=1"}
    import os

    env = {**os.environ, **faults}

    async def body():
        async with pipeline(config, env=env) as (core, _):
            prompts = _prompts(tok, 12, seed=1)
            params = RequestParams(max_tokens=40, ignore_eos=True)
            handles = [await core.submit(p, params) for p in prompts]
            seen = {h.request_id: [] for h in handles}

            async def collect(h):
                async for d in h:
                    seen[h.request_id].extend(d.token_ids)
                return h.result

            results = await asyncio.gather(*(collect(h) for h in handles))
            for p, h, r in zip(prompts, handles, results, strict=True):
                tokens, _ = expected_fake_tokens(p, tok.vocab_size, 40, ignore_eos=True)
                assert seen[h.request_id] == tokens  # every token, in order
                assert r.finish_reason.api == "length"

    run(body())


@pytest.mark.parametrize("mode", MODES)
def test_stop_string_ends_stream_and_frees_slot(tokenizer_512, mode):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, mode)

    async def body():
        async with pipeline(config) as (core, _):
            prompt = _prompts(tok, 1, seed=3)[0]
            tokens, _ = expected_fake_tokens(prompt, tok.vocab_size, 200, ignore_eos=True)
            full = tok.decode(tokens, skip_special_tokens=True)
            stop = full[len(full) // 2 : len(full) // 2 + 3]  # some text spanning tokens
            assert stop.strip()
            for include in (False, True):
                params = RequestParams(
                    max_tokens=200,
                    ignore_eos=True,
                    stop=(stop,),
                    include_stop_str_in_output=include,
                )
                text, result = await (await core.submit(prompt, params)).finished()
                cut = full.index(stop)
                assert text == full[: cut + (len(stop) if include else 0)]
                assert result.finish_reason.api == "stop"
                assert result.completion_tokens < 200
            decode = core.workers.get("decode", 0)
            await wait_for(
                lambda: getattr(decode.load, "free_slots", None) == config.model.num_slots,
                5,
                "slots freed",
            )

    run(body())


@pytest.mark.parametrize("mode", MODES)
def test_abort_at_random_points_leaves_nothing_behind(tokenizer_512, mode):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        mode,
        model={"fake_step_s": 0.001, "num_slots": 16},
        router={"max_running": 64, "max_queued": 2000},
        lifecycle={"state_ttl_s": 1.0, "heartbeat_interval_s": 0.1, "liveness_timeout_s": 2.0},
    )

    async def body():
        async with pipeline(config) as (core, _):
            rng = random.Random(7)
            prompts = _prompts(tok, 50, seed=4)

            async def one(i):
                params = RequestParams(max_tokens=rng.randint(40, 200), ignore_eos=True)
                h = await core.submit(prompts[i % len(prompts)], params)
                wait_tokens = rng.randint(-5, 30)  # <= 0: abort before the first token
                if wait_tokens > 0:
                    async for d in h:
                        wait_tokens -= len(d.token_ids)
                        if wait_tokens <= 0:
                            break
                core.abort(h)
                return h.result

            results = await asyncio.gather(*(one(i) for i in range(1000)))
            reasons = {(r.finish_reason, r.error) for r in results}
            assert all(r.finish_reason.api in ("abort", "length") for r in results), reasons
            aborted = sum(r.finish_reason.api == "abort" for r in results)
            assert aborted > 600  # the rest ran to length
            assert core.admission.running == 0 and not core.admission.waiters
            assert not len(core.requests)

            def clean():
                if len(core.requests.recent):
                    return False
                for w in core.workers.workers.values():
                    load = w.load
                    if load is None:
                        return False
                    if w.role == "decode" and (
                        load.free_slots != 16 or load.pending or load.tombstones
                    ):
                        return False
                    if w.role == "prefill" and load.queue:
                        return False
                    if w.role == "detok" and (load.streams or load.early or load.tombstones):
                        return False
                return True

            # tombstones expire after state_ttl_s; everything else must already be gone
            await wait_for(clean, 10, "every slot free and no per-request state left")

    run(body(), timeout_s=300)


def test_overload_is_refused_clearly(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        "threads",
        model={"fake_step_s": 0.01},
        router={"max_running": 2, "max_queued": 1, "queue_timeout_s": 5.0},
    )

    async def body():
        async with pipeline(config) as (core, _):
            prompt = _prompts(tok, 1)[0]
            params = RequestParams(max_tokens=100, ignore_eos=True)
            running = [await core.submit(prompt, params) for _ in range(2)]
            queued = asyncio.create_task(core.submit(prompt, params))
            await wait_for(lambda: len(core.admission.waiters) == 1, 5, "the third request queued")
            with pytest.raises(Overloaded):
                await core.submit(prompt, params)
            for h in running:
                await h.finished()
            text, result = await (await queued).finished()
            assert result.finish_reason.api == "length"

    run(body())


def _admission_config(tokenizer: str, slots: int, ahead: int, step_s: float):
    """Threads mode, max_running far above the slots: admission is the router's to decide."""
    return make_config(
        tokenizer,
        "threads",
        model={"fake_step_s": step_s, "num_slots": slots},
        router={"max_running": 64, "admit_ahead_tokens": ahead, "max_queued": 16},
    )


async def _all_complete(tasks: list[asyncio.Task], max_tokens: int) -> None:
    """Every submitted request ends by length with all its tokens (ignore_eos)."""
    for t in tasks:
        text, result = await (await t).finished()
        assert result.finish_reason.api == "length" and result.completion_tokens == max_tokens


def test_admission_waits_for_a_free_decode_slot(tokenizer_512):
    """With max_running far above the decode slots, the router admits a request only for a free
    decode slot: the rest wait at the router, instead of being prefilled only to stall at the
    decode worker between their first and second token. Every request still completes."""
    tok = load_tokenizer(tokenizer_512)
    config = _admission_config(tokenizer_512, slots=2, ahead=0, step_s=0.01)

    async def body():
        async with pipeline(config) as (core, _):
            prompt = _prompts(tok, 1)[0]
            params = RequestParams(max_tokens=30, ignore_eos=True)
            tasks = [asyncio.create_task(core.submit(prompt, params)) for _ in range(6)]
            await wait_for(lambda: len(core.admission.waiters) == 4, 5, "four requests queued")
            assert core.admission.running == 2 and sum(t.done() for t in tasks) == 2
            await _all_complete(tasks, 30)
            assert core.admission.running == 0 and not core.admission.waiters

    run(body())


def test_admission_runs_ahead_of_a_slot_about_to_free(tokenizer_512):
    """With every slot taken, a request is admitted when its prefill (admit_ahead_tokens decode
    steps) would be done by the time a running one ends, with one prefill of slack: with one
    slot, the second request is admitted once the first has at most 2 x 5 tokens left, and
    before it has ended."""
    tok = load_tokenizer(tokenizer_512)
    config = _admission_config(tokenizer_512, slots=1, ahead=5, step_s=0.02)

    async def body():
        async with pipeline(config) as (core, _):
            prompt = _prompts(tok, 1)[0]
            params = RequestParams(max_tokens=40, ignore_eos=True)
            first = await core.submit(prompt, params)
            second_task = asyncio.create_task(core.submit(prompt, params))
            await wait_for(lambda: len(core.admission.waiters) == 1, 5, "the second request queued")
            # the slot is busy with more than 2 x admit_ahead_tokens to go: the second one waits
            assert core.admission.running == 1 and first.completion_tokens < 40 - 10
            second = await asyncio.wait_for(second_task, 10)
            assert first.result is None, "admitted only after the first request ended"
            assert 40 - 10 <= first.completion_tokens < 40
            for handle in (first, second):
                text, result = await handle.finished()
                assert result.finish_reason.api == "length" and result.completion_tokens == 40
            assert core.admission.running == 0

    run(body())


def test_admission_ahead_stays_bounded_under_a_closed_loop(tokenizer_512):
    """Requests admitted ahead (in prefill, or prefilled and waiting for a slot) never count as
    slots about to free: with 2 slots and 12 requests submitted at once, at most one request per
    slot waits ahead at any time, so none pauses long between its first and second token."""
    tok = load_tokenizer(tokenizer_512)
    config = _admission_config(tokenizer_512, slots=2, ahead=6, step_s=0.01)

    async def body():
        async with pipeline(config) as (core, _):
            prompt = _prompts(tok, 1)[0]
            params = RequestParams(max_tokens=24, ignore_eos=True)
            tasks = [asyncio.create_task(core.submit(prompt, params)) for _ in range(12)]
            most = 0
            # sampled: a request in the pipeline stays there for its 24 steps (10 ms each), so
            # no peak is shorter than a sample period
            while not all(t.done() for t in tasks) or core.admission.running:
                most = max(most, core.admission.running)
                await asyncio.sleep(0.002)
            assert 2 < most <= 4, f"{most} requests in the pipeline at once"
            await _all_complete(tasks, 24)

    run(body())


def _fake_run(prompt, vocab, n):
    tokens, _ = expected_fake_tokens(prompt, vocab, n, ignore_eos=True)
    return tokens


@pytest.mark.parametrize("mode", MODES)
def test_token_level_finishes(tokenizer_512, mode):
    """eos, stop_token_ids, min_tokens and ignore_eos, against the fake engine's arithmetic."""
    tok = load_tokenizer(tokenizer_512)
    vocab = tok.vocab_size
    (eos,) = sorted(tok.eos_ids)[:1]
    config = make_config(tokenizer_512, mode)
    # the fake engine's first token is 2 * sum(prompt) mod vocab: this prompt's is eos (id 0)
    eos_prompt = [vocab // 2]
    assert eos in tok.eos_ids and _fake_run(eos_prompt, vocab, 1) == [0] and eos == 0
    eos_at = 0
    prompt = tok.encode("stop tokens are tokens")
    plain = _fake_run(prompt, vocab, 40)
    stop_id = plain[5]
    first_stop = plain.index(stop_id)

    async def body():
        async with pipeline(config) as (core, _):

            async def gen(p, **kw):
                h = await core.submit(p, RequestParams(**kw))
                ids = []
                async for d in h:
                    ids.extend(d.token_ids)
                return ids, h.result

            ids, r = await gen(eos_prompt, max_tokens=30)
            assert r.finish_reason.api == "stop" and ids == _fake_run(eos_prompt, vocab, eos_at + 1)
            ids, r = await gen(eos_prompt, max_tokens=30, ignore_eos=True)
            assert r.finish_reason.api == "length" and len(ids) == 30
            ids, r = await gen(eos_prompt, max_tokens=30, min_tokens=eos_at + 2)
            # eos before min_tokens: ignored
            assert r.finish_reason.api == "length" and len(ids) == 30

            text_ids = _fake_run(prompt, vocab, first_stop + 1)
            h = await core.submit(prompt, RequestParams(max_tokens=40, stop_token_ids=(stop_id,)))
            text, r = await h.finished()
            assert r.finish_reason.api == "stop" and r.completion_tokens == first_stop + 1
            assert text == tok.decode(text_ids[:-1])  # the stop token's text is not output
            ids, r = await gen(prompt, max_tokens=40, stop_token_ids=(stop_id,), ignore_eos=True)
            assert r.finish_reason.api == "stop"  # ignore_eos never disables the client's stop ids
            ids, r = await gen(prompt, max_tokens=1)
            assert r.finish_reason.api == "length" and ids == plain[:1]  # finished at prefill

    run(body())
