"""The worker shell in one process, its loops driven by hand over inproc sockets: each role's
message table, the malformed count for types a role does not take, fail(), the fault hook, and a
prefix whose KV frames reach the decode handler through the real receive path."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import zmq

from decode_worker.slots import Slot
from decode_worker.worker import DecodeWorker
from detok_worker.worker import DetokWorker
from prefill_worker.worker import PrefillWorker
from splitserve import protocol
from splitserve.faults import DroppingSender, FaultySender
from splitserve.protocol import (
    Abort,
    DetokParams,
    GenerateRequest,
    PrefixHeader,
    RequestFailed,
    StopCriteria,
    TextBatch,
    TokenBatch,
    TransportCounters,
)
from splitserve.protocol.params import SamplingParams
from splitserve.transport import Receiver, Sender
from tests.pipeline_util import make_config

DEADLINE_S = 10.0


@pytest.fixture
def cluster(tokenizer_512) -> Iterator[Callable]:
    """make(worker_cls, environ) -> (worker, peers): peers are bound receivers standing in for
    the router, the detok workers and (for prefill) decode; keywords replace [model] keys. Every
    socket goes with the context at the end."""
    config = make_config(tokenizer_512, "threads")
    ctx = zmq.Context()

    def make(cls, environ=None, **model):
        cfg = replace(config, model=replace(config.model, **model)) if model else config
        peers = stand_in_peers(ctx, cfg, cls)
        return cls(cfg, 0, ctx, threading.Event(), environ or {}), peers

    # one worker per test: the worker and its peers bind the cluster's addresses

    try:
        yield make
    finally:
        ctx.destroy(linger=0)


def stand_in_peers(ctx: zmq.Context, config, cls) -> dict[str, Receiver]:
    """Bound receivers in the place of the router, the detok workers and (for a worker other
    than decode) the decode worker: what worker 0 of cls sends to."""
    a = config.addresses
    ends = {"router": a.router, **{f"detok{i}": e for i, e in enumerate(a.detok)}}
    if cls is not DecodeWorker:
        ends["decode"] = a.decode[0]
    if cls is DetokWorker:
        del ends["detok0"]  # the worker's own address
    return {name: Receiver(ctx, end, TransportCounters()) for name, end in ends.items()}


def request(rid: str, prompt=(5, 6, 7), max_tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(
        rid, 0, 0, 1, list(prompt), 0, SamplingParams(), StopCriteria(max_tokens=max_tokens),
        DetokParams(),
    )  # fmt: skip


def wait_for_message(receiver: Receiver, kind: type, pump: Callable[[], None] = lambda: None):
    """The first message of type kind at receiver, pumping a worker loop meanwhile."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        pump()
        receiver.poll(10)
        for msg, frames in receiver.drain():
            if isinstance(msg, kind):
                return msg, frames
    raise AssertionError(f"no {kind.__name__} within {DEADLINE_S}s")


def test_prefill_table_takes_requests_and_aborts(cluster):
    worker, _ = cluster(PrefillWorker)
    worker.dispatch([(request("a"), []), (request("b"), []), (Abort(["a"], [0]), [])])
    assert [r.request_id for r in worker.queue] == ["b"]
    assert worker.counters.malformed == 0


@pytest.mark.parametrize("cls", [PrefillWorker, DecodeWorker, DetokWorker])
def test_a_type_the_role_does_not_take_is_counted_and_skipped(cluster, cls):
    worker, _ = cluster(cls)
    worker.dispatch([(TextBatch([]), []), (RequestFailed(["x"], [0], "router", "?"), [])])
    assert worker.counters.malformed == 2
    assert worker.idle()


def test_fail_tells_the_router(cluster):
    worker, peers = cluster(DecodeWorker)
    worker.fail(["a", "b"], [0, 2], "something went wrong")
    msg, _ = wait_for_message(peers["router"], RequestFailed)
    assert msg == RequestFailed(["a", "b"], [0, 2], "decode", "something went wrong")


def test_prefill_sends_first_token_to_detok_and_prefix_to_decode(cluster):
    worker, peers = cluster(PrefillWorker)
    worker.dispatch([(request("a"), [])])
    worker.loop_once()
    first, _ = wait_for_message(peers["detok1"], TokenBatch)
    assert first.request_ids == ["a"] and first.seqs == [0]
    header, frames = wait_for_message(peers["decode"], PrefixHeader)
    assert header.request_id == "a" and header.first_token == first.tokens[0]
    assert len(frames) == len(header.kv_meta)


def test_prefix_frames_reach_the_decode_handler_and_tokens_leave(cluster):
    """A PrefixHeader with its KV frames, sent over the socket, is inserted and decoded."""
    worker, peers = cluster(DecodeWorker)
    prefix = worker.engine.prefill([5, 6, 7], SamplingParams())
    header = PrefixHeader(
        "a", 0, 1, prefix.length, 0, prefix.first_token, prefix.first_logprob, SamplingParams(),
        StopCriteria(max_tokens=3), protocol.kv_meta(prefix.kv),
    )  # fmt: skip
    sender = Sender(worker.ctx, worker.config.addresses.decode[0], TransportCounters())
    sender.send(header, prefix.kv)
    tokens: list[int] = []
    seqs: list[int] = []
    while len(tokens) < 2:  # tokens 1 and 2; the third (max_tokens) frees the slot
        batch, _ = wait_for_message(peers["detok1"], TokenBatch, worker.loop_once)
        assert set(batch.request_ids) == {"a"}  # one step's batch, or a chunk's (decode_steps)
        tokens += batch.tokens
        seqs += batch.seqs
    assert seqs == [1, 2]  # the chunk's tokens after the finishing one never leave
    assert worker.slots.free_count == worker.slots.capacity
    assert worker.idle() and worker.counters.malformed == 0


def test_faults_wrap_the_named_paths_only(cluster):
    spec = "prefill_to_detok_delay=0.3,prefill_to_decode_drop=1"
    worker, _ = cluster(PrefillWorker, {"SPLITSERVE_FAULTS": spec})
    assert all(isinstance(d, FaultySender) for d in worker.detoks)
    assert all(isinstance(d, DroppingSender) for d in worker.decodes)
    assert isinstance(worker.router, Sender)


def test_without_faults_the_senders_are_plain(cluster):
    worker, _ = cluster(PrefillWorker)
    assert all(type(s) is Sender for s in [worker.router, *worker.decodes, *worker.detoks])


def test_delayed_first_token_goes_out_when_the_shell_releases_it(cluster):
    worker, peers = cluster(PrefillWorker, {"SPLITSERVE_FAULTS": "prefill_to_detok_delay=0.01"})
    worker.dispatch([(request("a"), [])])
    worker.loop_once()
    # held by the fault until release_due(), which the shell's run() calls once per loop pass
    first, _ = wait_for_message(peers["detok1"], TokenBatch, worker.faults.release_due)
    assert first.request_ids == ["a"] and first.seqs == [0]


def take_slot(worker: DecodeWorker, rid: str) -> None:
    worker.slots.take(Slot(rid, 0, 0, StopCriteria(max_tokens=100), 1, 8))


def test_chunks_run_only_up_to_the_live_bound(cluster):
    """[model] decode_steps_max_live: the decode worker runs decode_steps steps a dispatch while
    at most that many slots are live, one step a dispatch above it."""
    worker, _ = cluster(DecodeWorker, decode_steps_max_live=2)
    take_slot(worker, "a")
    assert worker.chunk_steps() == 4
    take_slot(worker, "b")
    assert worker.chunk_steps() == 4
    take_slot(worker, "c")
    assert worker.chunk_steps() == 1  # three live: one step a dispatch
    worker.slots.release("b")
    assert worker.chunk_steps() == 4


def test_chunks_run_at_any_live_count_by_default(cluster):
    worker, _ = cluster(DecodeWorker)
    assert worker.config.model.decode_steps_max_live == 0
    for i in range(worker.engine.num_slots):
        take_slot(worker, f"r{i}")
    assert worker.chunk_steps() == 4


def test_chunks_run_only_while_some_slot_can_take_the_whole_chunk(cluster):
    """A chunk whose last steps no live request may take is not run: single steps instead (a
    request for two tokens used to cost four steps)."""
    worker, _ = cluster(DecodeWorker)
    k = worker.chunk
    assert k == 4
    # next_seq 1 (the first token came from prefill): max_tokens - 1 more tokens to come
    worker.slots.take(Slot("short", 0, 0, StopCriteria(max_tokens=k), 1, 8))
    assert worker.chunk_steps() == 1  # k - 1 more at most
    worker.slots.take(Slot("exact", 0, 0, StopCriteria(max_tokens=k + 1), 1, 8))
    assert worker.chunk_steps() == k  # this one can take all k
    worker.slots.release("exact")
    assert worker.chunk_steps() == 1


def prefix_for_detok(worker: DecodeWorker, rid: str, detok: int) -> tuple[PrefixHeader, list]:
    prefix = worker.engine.prefill([5, 6, 7], SamplingParams())
    header = PrefixHeader(
        rid, 0, detok, prefix.length, 0, prefix.first_token, prefix.first_logprob,
        SamplingParams(), StopCriteria(max_tokens=3), protocol.kv_meta(prefix.kv),
    )  # fmt: skip
    return header, prefix.kv


def test_a_prefix_for_a_detok_worker_not_yet_announced_waits_for_the_pool(cluster):
    """The router announces a new detok worker (DetokPool, over its own connection) before it
    places a request there, but prefill's prefix comes over another connection and can arrive
    first: the decode worker holds it until the pool names the index, then decodes to it."""
    worker, peers = cluster(DecodeWorker)
    header, kv = prefix_for_detok(worker, "a", 2)  # the pool has detok 0 and 1
    worker.dispatch([(header, kv)])
    worker.loop_once()
    assert not worker.slots and len(worker.awaiting_pool) == 1 and not worker.idle()
    assert not peers["router"].poll(0)  # not failed
    newcomer = "inproc://detok-2-newcomer"
    detok2 = Receiver(worker.ctx, newcomer, TransportCounters())
    worker.dispatch([(protocol.DetokPool([*worker.config.addresses.detok, newcomer]), [])])
    assert not worker.awaiting_pool
    batch, _ = wait_for_message(detok2, TokenBatch, worker.loop_once)
    assert batch.request_ids[0] == "a" and batch.seqs[0] == 1
    assert not drain_for(peers["router"], RequestFailed)


def test_a_prefix_for_a_detok_index_no_pool_names_fails_after_the_state_ttl(cluster):
    worker, peers = cluster(DecodeWorker)
    worker.config = replace(worker.config, lifecycle=replace(worker.config.lifecycle,
                                                             state_ttl_s=0.0))  # fmt: skip
    header, kv = prefix_for_detok(worker, "a", 5)
    worker.dispatch([(header, kv)])
    failed, _ = wait_for_message(peers["router"], RequestFailed, worker.loop_once)
    assert failed.request_ids == ["a"] and "detok index 5 not in the pool" in failed.message
    assert not worker.awaiting_pool and worker.idle()


def test_an_abort_drops_a_prefix_that_waits_for_the_pool(cluster):
    worker, _ = cluster(DecodeWorker)
    header, kv = prefix_for_detok(worker, "a", 2)
    worker.dispatch([(header, kv)])
    assert len(worker.awaiting_pool) == 1
    worker.dispatch([(Abort(["a"], [0]), [])])
    assert not worker.awaiting_pool and worker.idle()
    worker.loop_once()  # nothing left to insert or to fail
    assert not worker.slots


def drain_for(receiver: Receiver, kind: type) -> list:
    return [m for m, _ in receiver.drain() if isinstance(m, kind)] if receiver.poll(0) else []
