"""The prefill worker's batches (prefill_worker/batching.py), its loop driven by hand over inproc
sockets with the fake engine: one pass runs the plain requests at the front of the queue within
the token budget and sends every first token before any prefix; a request with logits controls
runs alone, in the next pass; a prompt over the budget still runs. With the prefix cache, a
request whose start is cached runs alone (prefill_cached computes only the rest), and one that
starts like a request already in the call waits for the next call, where it reuses that one's
blocks."""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from prefill_worker.batching import take_batch
from prefill_worker.worker import PrefillWorker
from splitserve.protocol import PrefixHeader, TokenBatch
from splitserve.protocol.params import LogitsControls
from tests.pipeline_util import expected_fake_tokens
from tests.test_worker_shell import (
    DEADLINE_S,
    cluster,  # noqa: F401 (the fixture)
    request,
    wait_for_message,
)

MIN_P = LogitsControls(min_p=0.05)


def received(receiver, kind: type, n: int) -> list:
    """The first n messages of type kind at receiver (within the shell tests' deadline)."""
    got: list = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < n and time.monotonic() < deadline:
        receiver.poll(10)
        got += [msg for msg, _ in receiver.drain() if isinstance(msg, kind)]
    assert len(got) == n, f"{len(got)} of {n} {kind.__name__} within {DEADLINE_S}s"
    return got


def test_take_batch_keeps_order_and_budget():
    reqs = [request("a", [1] * 10), request("b", [1] * 20), request("c", [1] * 30),
            request("d", [1] * 5)]  # fmt: skip
    queue = deque(reqs)
    assert [r.request_id for r in take_batch(queue, 60)] == ["a", "b", "c"]
    assert [r.request_id for r in take_batch(queue, 60)] == ["d"]
    long = deque([request("x", [1] * 100), request("y", [1] * 5)])
    assert [r.request_id for r in take_batch(long, 60)] == ["x"]  # alone, over the budget
    assert [r.request_id for r in take_batch(deque(reqs), 0)] == ["a"]  # 0: one a call


def test_a_request_with_controls_runs_alone():
    controlled = dataclasses.replace(request("c"), controls=MIN_P)
    queue = deque([request("a"), request("b"), controlled, request("d")])
    assert [r.request_id for r in take_batch(queue, 1024)] == ["a", "b"]
    assert [r.request_id for r in take_batch(queue, 1024)] == ["c"]
    assert [r.request_id for r in take_batch(queue, 1024)] == ["d"]


def test_one_pass_sends_the_batch_first_tokens_then_prefixes(cluster):  # noqa: F811
    worker, peers = cluster(PrefillWorker)
    prompts = {"a": [5, 6, 7], "b": [9, 1], "c": [3, 3, 3, 3]}
    controlled = dataclasses.replace(request("d", [4, 4]), controls=MIN_P)
    worker.dispatch([(request(rid, p), []) for rid, p in prompts.items()] + [(controlled, [])])
    worker.loop_once()  # the three plain requests; "d" waits for the next pass
    assert [r.request_id for r in worker.queue] == ["d"]
    batches = received(peers["detok1"], TokenBatch, 3)
    firsts = {rid: t for b in batches for rid, t in zip(b.request_ids, b.tokens, strict=True)}
    vocab = worker.engine.vocab_size
    assert firsts == {rid: expected_fake_tokens(p, vocab, 1)[0][0] for rid, p in prompts.items()}
    headers = received(peers["decode"], PrefixHeader, 3)
    assert {h.request_id: h.first_token for h in headers} == firsts
    worker.loop_once()
    batch, _ = wait_for_message(peers["detok1"], TokenBatch)
    assert batch.request_ids == ["d"] and worker.idle()


def test_a_cached_start_or_a_shared_start_stops_the_run():
    keys = {"a": b"A", "b": b"B", "s1": b"S", "s2": b"S", "c": b"C"}
    cached = {b"C"}

    def take(ids):
        queue = deque(request(rid) for rid in ids)
        out = []
        while queue:
            batch = take_batch(queue, 1024, lambda r: keys.get(r.request_id), cached.__contains__)
            out.append([r.request_id for r in batch])
        return out

    assert take(["a", "b", "s1", "s2"]) == [["a", "b", "s1"], ["s2"]]  # s2 reuses s1's blocks
    assert take(["a", "c", "b"]) == [["a"], ["c"], ["b"]]  # c's start is cached: alone
    assert take(["c", "a", "b"]) == [["c"], ["a", "b"]]
    assert take(["x", "y", "a"]) == [["x", "y", "a"]]  # no key (too short, cache off): batch


def test_a_burst_sharing_a_system_prompt_reuses_it_after_the_first_call(cluster):  # noqa: F811
    """Through the real worker and its prefix cache (fake engine, 16-token blocks): the first
    of two requests that share 40 tokens runs in a call with an unrelated one; the second runs
    next, alone, and takes the shared blocks from the cache. Every first token is exact."""
    worker, peers = cluster(PrefillWorker)
    system = [(7 * i) % 200 + 1 for i in range(40)]
    prompts = {"u1": system + [3, 4], "other": [9, 8, 7, 6], "u2": system + [5, 6, 2]}
    worker.dispatch([(request(rid, p), []) for rid, p in prompts.items()])
    worker.loop_once()
    assert worker.batched_calls == 1 and [r.request_id for r in worker.queue] == ["u2"]
    worker.loop_once()
    assert worker.idle() and worker.batched_calls == 1
    batches = received(peers["detok1"], TokenBatch, 3)
    assert {o.request_id: o.cached_tokens for b in batches for o in b.opens} == {
        "u1": 0, "other": 0, "u2": 32}  # fmt: skip
    firsts = {rid: t for b in batches for rid, t in zip(b.request_ids, b.tokens, strict=True)}
    vocab = worker.engine.vocab_size
    assert firsts == {rid: expected_fake_tokens(p, vocab, 1)[0][0] for rid, p in prompts.items()}


def test_a_batched_call_stores_every_prompt_in_the_cache(cluster):  # noqa: F811
    worker, peers = cluster(PrefillWorker)
    first = [(3 * i) % 200 + 1 for i in range(40)]
    second = [(5 * i) % 200 + 2 for i in range(40)]
    worker.dispatch([(request("a", first), []), (request("b", second), [])])
    worker.loop_once()
    assert worker.batched_calls == 1 and worker.idle()
    received(peers["detok1"], TokenBatch, 2)
    worker.dispatch([(request("a2", first + [1]), []), (request("b2", second + [2]), [])])
    worker.loop_once()  # a2's start is cached: alone; then b2's, alone too
    worker.loop_once()
    batches = received(peers["detok1"], TokenBatch, 2)
    assert {o.request_id: o.cached_tokens for b in batches for o in b.opens} == {"a2": 32,
                                                                                "b2": 32}
    assert worker.batched_calls == 1
