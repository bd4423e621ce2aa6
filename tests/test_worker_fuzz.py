"""Fuzzing the workers: every message type, with random field values (well-formed messages of the
wire strategies, made to touch the worker's own state: a few request ids, small indices, epochs
and positions, token ids around the vocabulary's end, KV arrays of the right and the wrong
layout), is handed to each role's dispatch() and then to a pass of its loop, in process over
inproc sockets. No exception may escape, the worker's state stays consistent after every batch,
a request the fuzzed messages do not name comes out exactly as the fake engine's arithmetic says,
and afterwards the worker still serves a new request."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decode_worker.worker import DecodeWorker
from detok_worker.worker import DetokWorker
from prefill_worker.worker import PrefillWorker
from splitserve import protocol
from splitserve.engine.fake.engine import fake_first_token, fake_logprob
from splitserve.protocol import (
    DetokParams,
    GenerateRequest,
    OpenStream,
    PrefixHeader,
    StopCriteria,
    TextBatch,
    TokenBatch,
)
from splitserve.protocol.params import SamplingParams
from splitserve.tokenizers import load_tokenizer
from splitserve.transport import Receiver
from splitserve.worker import pool_problem
from tests.pipeline_util import expected_fake_tokens, make_config
from tests.test_protocol_fuzz import broken_frames
from tests.test_worker_shell import stand_in_peers
from tests.wire_strategies import BY_TYPE

VOCAB = 512
RIDS = ["a", "b", "c"]  # what the fuzzed messages name; the genuine request is none of them
GENUINE = "genuine"
DEADLINE_S = 20.0
SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@contextlib.contextmanager
def worker_of(cls, tokenizer: str) -> Iterator[tuple]:
    """(worker, peers): the worker on the cluster's inproc addresses, and bound receivers in the
    place of the router, the detok workers and (for prefill) the decode worker."""
    config = make_config(tokenizer, "threads", model={"num_slots": 4})
    ctx = zmq.Context()
    try:
        peers = stand_in_peers(ctx, config, cls)
        yield cls(config, 0, ctx, threading.Event(), {}), peers
    finally:
        ctx.destroy(linger=0)


# ---- messages that reach the worker's state ---------------------------------------------------


TAKES = {  # the message types each role's handler table holds (the others are counted)
    PrefillWorker: [GenerateRequest, protocol.Abort, protocol.Fence, protocol.DetokPool],
    DecodeWorker: [PrefixHeader, protocol.Abort, protocol.Finish, protocol.Repin,
                   protocol.DetokPool],
    DetokWorker: [TokenBatch, protocol.Abort, protocol.ResumeStream],
}  # fmt: skip


@st.composite
def aimed(draw, types=tuple(BY_TYPE)):
    """A well-formed message of one of these types, its ids, indices, epochs and positions drawn
    from the small ranges the worker holds state for, so that it meets that state."""
    msg, arrays = draw(st.sampled_from(list(types)).flatmap(lambda t: BY_TYPE[t]))
    # a few ids, so that messages meet each other's state; fresh ones now and then, so that
    # tombstones (Abort, Finish) do not end up covering every id the fuzz uses
    rid = st.sampled_from(RIDS) | st.text(min_size=1, max_size=3).filter(lambda r: r != GENUINE)
    small = st.integers(0, 2)  # there are 2 detok workers and 1 decode worker
    position = st.integers(0, 6)
    # now and then outside the vocabulary (an engine's may be larger than its tokenizer's)
    token = st.integers(0, VOCAB - 1) | st.sampled_from([VOCAB, VOCAB + 1, 2**31 - 1])
    changes = {}
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if f.name == "request_id":
            changes[f.name] = draw(rid)
        elif f.name == "request_ids":
            changes[f.name] = [draw(rid) for _ in value]
        elif f.name in ("decode_index", "detok_index", "index"):
            changes[f.name] = draw(small)
        elif f.name in ("epoch", "start_seq", "first_seq", "text_chars"):
            changes[f.name] = draw(position)
        elif f.name == "detok_indices":
            changes[f.name] = [draw(small) for _ in value]
        elif f.name in ("epochs", "seqs", "from_seqs"):
            changes[f.name] = [draw(position) for _ in value]
        elif f.name in ("tokens", "token_ids", "prompt"):
            changes[f.name] = [draw(token) for _ in value]
        elif f.name == "first_token":
            changes[f.name] = draw(token)
        elif f.name == "opens":
            changes[f.name] = [dataclasses.replace(o, request_id=draw(rid), epoch=draw(position),
                                                   decode_index=draw(small)) for o in value]
    msg = one_router(dataclasses.replace(msg, **changes))
    if isinstance(msg, TokenBatch) and msg.opens and draw(st.booleans()):
        # a stream's opening and its first tokens in order, as prefill and decode send them
        head, n = msg.opens[0], len(msg.request_ids)
        msg = dataclasses.replace(msg, request_ids=[head.request_id] * n, epochs=[head.epoch] * n,
                                  seqs=list(range(n)))  # fmt: skip
    if isinstance(msg, PrefixHeader):
        msg, arrays = draw(prefix_arrays(msg))
    return msg, arrays


@st.composite
def prefix_arrays(draw, header: PrefixHeader):
    """A prefix whose KV arrays are the fake engine's own (float32 [length, 1], the prompt),
    consistent with its first token or not, or of a wrong count, dtype or shape."""
    length = draw(st.integers(1, 6))
    prompt = draw(st.lists(st.integers(0, VOCAB - 1), min_size=length, max_size=length))
    kind = draw(st.sampled_from(["right", "right", "wrong_first", "1d", "two", "dtype", "none"]))
    kv = [np.asarray(prompt, np.float32).reshape(length, 1)]
    first = fake_first_token(prompt, VOCAB) if kind != "wrong_first" else draw(st.integers(0, 600))
    if kind == "1d":
        kv = [kv[0].reshape(length)]
    elif kind == "two":
        kv = kv * 2
    elif kind == "dtype":
        kv = [kv[0].astype(np.float64)]
    elif kind == "none":
        kv = []
    header = dataclasses.replace(header, length=length, first_token=first,
                                 kv_meta=protocol.kv_meta(kv) or [["<f4", [length, 1]]])
    return header, kv


def over_the_wire(msg, arrays):
    """(message, frames) as the worker's receiver hands them over: encoded and decoded."""
    frames = [bytes(f) for f in protocol.encode(msg, arrays)]
    return protocol.decode(frames)


@st.composite
def fuzzed(draw, cls):
    """A message as a receiver would hand it over: mostly an aimed one of a type the role takes,
    else of any type, or a broken frame that decoded all the same (the decoder refuses most of
    those: they never reach a handler)."""
    kind = draw(st.integers(0, 7))
    if kind == 0:
        try:
            msg, frames = protocol.decode(draw(broken_frames()))
        except protocol.ProtocolError:
            return None
        return one_router(msg), frames
    msg, arrays = draw(aimed(TAKES[cls] if kind > 1 else tuple(BY_TYPE)))
    try:
        return over_the_wire(msg, arrays)
    except protocol.ProtocolError:  # e.g. an announced KV array without its frame
        return None


def one_router(msg):
    """The message as the one router's: a newer router's word ends every older request, by
    design (tests/test_router_incarnation.py), which is no message naming them."""
    if isinstance(msg, protocol.RouterHello):
        return dataclasses.replace(msg, incarnation=0)
    if isinstance(msg, TokenBatch):
        return dataclasses.replace(
            msg, opens=[dataclasses.replace(o, router_incarnation=0) for o in msg.opens]
        )
    if hasattr(msg, "router_incarnation"):
        return dataclasses.replace(msg, router_incarnation=0)
    return msg


def batches(cls):
    return st.lists(fuzzed(cls), min_size=1, max_size=6).map(lambda b: [m for m in b if m])


def naming_no_other(batch: list) -> list:
    """The batch without the DetokPool messages that would apply: a new pool is the router's
    word on every request (the tests of the pool are test_scale_out's), while the property here
    is that a message cannot change the output of a request it does not name."""
    return [(m, f) for m, f in batch
            if not isinstance(m, protocol.DetokPool) or pool_problem(m.endpoints)]  # fmt: skip


# ---- each role: one pass, its consistency -----------------------------------------------------


def one_pass(worker) -> None:
    """The role's loop once (its socket is empty: the fuzz goes through dispatch())."""
    if isinstance(worker, PrefillWorker):
        while worker.queue:
            worker.loop_once()
    else:
        worker.loop_once()


def assert_consistent(worker) -> None:
    if isinstance(worker, PrefillWorker):
        assert len(worker.queue) <= worker.max_queue
    elif isinstance(worker, DecodeWorker):
        slots, live = worker.slots, [s for s, _ in worker.slots.live()]
        assert slots.free_count + len(slots) == slots.capacity
        assert sorted(np.flatnonzero(worker.engine._live).tolist()) == sorted(live)
        assert len(worker.pending) <= worker.max_pending
        assert all(worker.detok(state.detok_index) for _, state in worker.slots.live())
    else:
        assert all(rid == s.request_id for rid, s in worker.streams.items())
        assert not worker.touched and not worker.opened  # emit() ran to its end


def drain(receiver: Receiver) -> list:
    out = []
    while receiver.poll(0):
        out += receiver.drain()
    return out


# ---- the genuine request of each role ---------------------------------------------------------

PROMPT = [5, 6, 7]
MAX_TOKENS = 40


def genuine_request(rid: str = GENUINE) -> GenerateRequest:
    return GenerateRequest(rid, 0, 0, 1, PROMPT, 0, SamplingParams(),
                           StopCriteria(MAX_TOKENS, ignore_eos=True), DetokParams())  # fmt: skip


def genuine_prefix(rid: str = GENUINE) -> tuple[PrefixHeader, list]:
    first = fake_first_token(PROMPT, VOCAB)
    kv = [np.asarray(PROMPT, np.float32).reshape(len(PROMPT), 1)]
    header = PrefixHeader(rid, 0, 1, len(PROMPT), 0, first, fake_logprob(first, VOCAB),
                          SamplingParams(), StopCriteria(MAX_TOKENS, ignore_eos=True),
                          protocol.kv_meta(kv))  # fmt: skip
    return over_the_wire(header, kv)


def tokens_of(batches: list, rid: str) -> list[int]:
    """rid's tokens in order of position, from the TokenBatches received."""
    seen = {}
    for msg, _ in batches:
        if isinstance(msg, TokenBatch):
            for r, seq, t in zip(msg.request_ids, msg.seqs, msg.tokens, strict=True):
                if r == rid:
                    seen.setdefault(seq, t)
    return [seen[k] for k in sorted(seen)]


# ---- the tests ----------------------------------------------------------------------------------


def test_the_decode_worker_survives_every_message_and_keeps_the_others_output(tokenizer_512):
    expected, _ = expected_fake_tokens(PROMPT, VOCAB, MAX_TOKENS, ignore_eos=True)
    with worker_of(DecodeWorker, tokenizer_512) as (worker, peers):
        worker.dispatch([genuine_prefix()])
        received: list = []

        @SETTINGS
        @given(batches(DecodeWorker).map(naming_no_other))
        def fuzz(batch):
            worker.dispatch(batch)
            one_pass(worker)
            assert_consistent(worker)
            received.extend(drain(peers["detok1"]))

        fuzz()
        while worker.slots.get(GENUINE) is not None:  # the genuine request runs to its end
            one_pass(worker)
        received += drain_until(peers["detok1"], lambda got: len(tokens_of(got, GENUINE))
                                >= MAX_TOKENS - 1, received)  # fmt: skip
        # token 0 is prefill's: decode sends positions 1 on, exactly the fake engine's
        assert tokens_of(received, GENUINE) == expected[1:]
        still_serves_decode(worker, peers)


def test_the_detok_worker_survives_every_message_and_keeps_the_others_text(tokenizer_512):
    with worker_of(DetokWorker, tokenizer_512) as (worker, peers):
        opens = [OpenStream(GENUINE, 0, 0, DetokParams(), False)]
        tokens = [300 + i for i in range(MAX_TOKENS)]
        worker.dispatch([over_the_wire(batch_of(GENUINE, 0, tokens[:1], opens), [])])
        texts: list = []
        sent = [1]

        @SETTINGS
        @given(batches(DetokWorker))
        def fuzz(batch):
            if sent[0] < len(tokens) - 1:  # the genuine stream goes on; its last token ends it
                batch = [over_the_wire(batch_of(GENUINE, sent[0], tokens[sent[0]:sent[0] + 1]),
                                       []), *batch]  # fmt: skip
                sent[0] += 1
            worker.dispatch(batch)
            worker.emit()
            worker.prune()
            assert_consistent(worker)
            texts.extend(drain(peers["router"]))

        fuzz()
        rest = tokens[sent[0]:]
        worker.dispatch([over_the_wire(batch_of(GENUINE, sent[0], rest, finish_last=True), [])])
        worker.emit()
        texts += drain_until(peers["router"], lambda got: finished(got, GENUINE), texts)
        ids = [t for msg, _ in texts if isinstance(msg, TextBatch) for d in msg.deltas
               if d.request_id == GENUINE for t in d.token_ids]  # fmt: skip
        text = "".join(d.text for msg, _ in texts if isinstance(msg, TextBatch)
                       for d in msg.deltas if d.request_id == GENUINE)  # fmt: skip
        assert ids == tokens
        assert text == load_tokenizer(tokenizer_512).decode(tokens)


def test_the_prefill_worker_survives_every_message(tokenizer_512):
    with worker_of(PrefillWorker, tokenizer_512) as (worker, peers):

        @SETTINGS
        @given(batches(PrefillWorker))
        def fuzz(batch):
            worker.dispatch(batch)
            one_pass(worker)
            assert_consistent(worker)
            for peer in peers.values():
                drain(peer)

        pool = list(worker._detok_endpoints)
        fuzz()
        # a fuzzed DetokPool may have taken detok 0 out (an empty endpoint is valid): the
        # router's word, which the genuine request below must not be judged by
        worker.dispatch([over_the_wire(protocol.DetokPool(pool), [])])
        worker.dispatch([over_the_wire(genuine_request(), [])])
        one_pass(worker)
        got = drain_until(peers["decode"], lambda g: any(isinstance(m, PrefixHeader) for m, _ in g))
        header = next(m for m, _ in got if isinstance(m, PrefixHeader))
        assert header.request_id == GENUINE
        assert header.first_token == fake_first_token(PROMPT, VOCAB)


# ---- helpers of the tests -----------------------------------------------------------------------


def batch_of(rid: str, start: int, tokens: list[int], opens=(), finish_last=False) -> TokenBatch:
    n = len(tokens)
    finishes = [0] * n
    if finish_last and n:
        finishes[-1] = int(protocol.TokenFinish.LENGTH)
    return TokenBatch(protocol.Source.PREFILL if opens else protocol.Source.DECODE, 0, [rid] * n,
                      [0] * n, list(range(start, start + n)), tokens, [0.0] * n, finishes,
                      list(opens))  # fmt: skip


def finished(got: list, rid: str) -> bool:
    return any(d.request_id == rid and d.finish_reason for m, _ in got if isinstance(m, TextBatch)
               for d in m.deltas)  # fmt: skip


def drain_until(receiver: Receiver, done, already: list | None = None) -> list:
    got: list = []
    deadline = time.monotonic() + DEADLINE_S
    while not done([*(already or []), *got]):
        assert time.monotonic() < deadline, "the worker stopped sending"
        receiver.poll(50)
        got += receiver.drain()
    return got


def still_serves_decode(worker, peers) -> None:
    """A request that comes after the fuzzing runs as on a fresh worker."""
    worker.dispatch([genuine_prefix("after")])
    one_pass(worker)  # inserts it
    while worker.slots.get("after") is not None:
        one_pass(worker)
    got = drain_until(peers["detok1"], lambda g: len(tokens_of(g, "after")) >= MAX_TOKENS - 1)
    expected, _ = expected_fake_tokens(PROMPT, VOCAB, MAX_TOKENS, ignore_eos=True)
    assert tokens_of(got, "after") == expected[1:]


@pytest.mark.parametrize("cls", [PrefillWorker, DecodeWorker, DetokWorker])
def test_messages_from_the_wrong_role_are_dropped_on_curve(cls):
    """The sender checks of WorkerLoop.receive, by table: what each role takes from whom."""
    from splitserve.security import sent_by

    assert sent_by(genuine_request(), "router")
    assert not sent_by(genuine_request(), "detok-0")
    assert not sent_by(batch_of("x", 0, [1]), "prefill-0")  # source DECODE, from prefill
    assert sent_by(batch_of("x", 0, [1], opens=[OpenStream("x", 0, 0, DetokParams(), False)]),
                   "prefill-0")  # fmt: skip
    assert not sent_by(protocol.Abort(["x"], [0]), "decode-0")
    assert not sent_by(protocol.Finish(["x"], [0]), "prefill-0")
    assert cls  # every role uses the one table
