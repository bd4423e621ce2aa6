"""Many prefill and decode workers (xPyD) with real processes (and threads) and the fake engine:
every stream equals the full decode whichever workers it was placed on, placement spreads
requests by load (equal workers get equal shares; a worker with half the slots about half), and
the death of one decode worker moves only its own requests while the others run on."""

from __future__ import annotations

import asyncio
import collections

import pytest

from router.requests import RequestParams
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import expected_fake_tokens, make_config, pipeline, run, wait_for

pytestmark = pytest.mark.slow


def _prompt(tok, i: int) -> list[int]:
    return tok.encode(f"request {i}: héllo wörld 東京 " * (1 + i % 3))


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_two_by_two_streams_equal_the_full_decode(tokenizer_512, mode):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512, mode, cluster={"prefill_workers": 2, "decode_workers": 2}
    )

    async def body():
        async with pipeline(config) as (core, _):
            handles = []
            for i in range(40):
                params = RequestParams(max_tokens=5 + (i * 7) % 50, ignore_eos=True)
                handles.append((i, params, await core.submit(_prompt(tok, i), params)))
            results = await asyncio.gather(*(h.finished() for _, _, h in handles))
            for (i, params, handle), (text, result) in zip(handles, results, strict=True):
                tokens, _ = expected_fake_tokens(
                    _prompt(tok, i), tok.vocab_size, params.max_tokens, ignore_eos=True
                )
                assert list(handle.token_ids) == tokens
                assert text == tok.decode(tokens, skip_special_tokens=True)
                assert result.finish_reason.api == "length"
            used = {(h.stamp.prefill, h.stamp.decode) for _, _, h in handles}
            assert {p for p, _ in used} == {0, 1} and {d for _, d in used} == {0, 1}

    run(body(), timeout_s=180)


def _shares(handles) -> collections.Counter:
    return collections.Counter(h.stamp.decode for h in handles)


@pytest.mark.parametrize("slots", [(8, 8), (8, 4)])
def test_decode_workers_get_shares_that_follow_their_slots(tokenizer_512, slots):
    """400 requests through 2 decode workers, always more in flight than slots: equal workers
    take equal shares within 15%; a worker with half the slots takes about half as many.

    A worker's share follows its rate, slots / step time, and a step costs the fake engine's
    sleep plus the pipeline's work for each of its rows. The sleep is 10 ms so that the rows'
    work, which grows with a busy host, cannot tip the shares: with a 2 ms sleep a run on a
    quiet host gave the 8-slot worker 244 of the 400 where 267 +- 40 was asked: its steps,
    with twice the rows' work, took about 1.3x the 4-slot worker's (inferred from the shares)."""
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        model={"fake_step_s": 0.01},
        cluster={"decode_workers": 2, "decode_slots": list(slots)},
        router={"max_running": 2 * sum(slots), "max_queued": 400},
    )

    async def body():
        async with pipeline(config) as (core, _):
            params = RequestParams(max_tokens=24, ignore_eos=True)

            async def one(i):
                handle = await core.submit(_prompt(tok, i), params)
                await handle.finished()
                return handle

            handles = await asyncio.gather(*(one(i) for i in range(400)))
            shares = _shares(handles)
            assert sum(shares.values()) == 400
            expected = [400 * n / sum(slots) for n in slots]
            for d, want in enumerate(expected):
                assert abs(shares[d] - want) <= 0.15 * want, (shares, expected)

    run(body(), timeout_s=240)


def test_a_full_decode_worker_is_never_chosen_over_one_with_room(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        model={"fake_step_s": 0.01, "max_seq_len": 1024},
        cluster={"decode_workers": 2, "decode_slots": [4, 2]},
        router={"max_running": 6},
    )

    async def body():
        async with pipeline(config) as (core, _):
            params = RequestParams(max_tokens=500, ignore_eos=True)
            handles = [await core.submit(_prompt(tok, i), params) for i in range(6)]
            # the six slots are filled exactly: four on worker 0, two on worker 1
            assert _shares(handles) == {0: 4, 1: 2}
            for h in handles:
                core.abort(h)

    run(body(), timeout_s=120)


def test_one_decode_worker_dies_only_its_requests_move_and_it_rejoins(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        model={"fake_step_s": 0.02},
        cluster={"decode_workers": 2},
        router={"max_running": 16},
    )

    async def body():
        async with pipeline(config) as (core, stack):
            params = RequestParams(max_tokens=150, ignore_eos=True)
            handles = [await core.submit(_prompt(tok, i), params) for i in range(12)]
            await wait_for(lambda: all(h.completion_tokens >= 2 for h in handles), 60, "streams")
            on_dead = {h.request_id for h in handles if h.stamp.decode == 1}
            assert on_dead and len(on_dead) < len(handles)
            stack.kill("decode", 1)
            results = await asyncio.gather(*(h.finished() for h in handles))
            for i, (h, (_, result)) in enumerate(zip(handles, results, strict=True)):
                tokens, _ = expected_fake_tokens(_prompt(tok, i), tok.vocab_size, 150,
                                                 ignore_eos=True)  # fmt: skip
                assert result.finish_reason.api == "length" and list(h.token_ids) == tokens
                # only the dead worker's requests moved, to the live one
                assert (h.migrations > 0) == (h.request_id in on_dead)
                assert h.stamp.decode == 0 or h.request_id not in on_dead
            stack.restart("decode", 1)
            await wait_for(lambda: core.workers.get("decode", 1).state == "ready", 60, "rejoin")
            again = [await core.submit(_prompt(tok, i), params) for i in range(8)]
            await asyncio.gather(*(h.finished() for h in again))
            assert _shares(again) == {0: 4, 1: 4}  # back to two decode workers

    run(body(), timeout_s=240)


def test_serve_starts_p_prefill_and_d_decode_workers(tokenizer_512):
    import subprocess
    import sys

    import httpx

    from splitserve.launch.ports import free_port
    from tests.http_stack import wait_healthy

    port = free_port()
    cmd = [sys.executable, "-m", "splitserve", "serve", "--engine", "fake", "--tokenizer",
           tokenizer_512, "--port", str(port), "--prefill-workers", "2", "--decode-workers", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 120)
        workers = httpx.get(f"{url}/health", timeout=10).json()["workers"]
        ready = collections.Counter(w["role"] for w in workers if w["state"] == "ready")
        assert ready == {"prefill": 2, "decode": 3, "detok": 2}
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 5}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    finally:
        proc.terminate()
        proc.wait(timeout=60)
