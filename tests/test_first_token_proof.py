"""The first-token bound's proof is causal (router/liveness.py, docs/protocol.md): a request is
taken for lost only once its prefill worker's load shows an empty queue at or past the request's
send sequence number, and stall_timeout_s more passed without its token. Heartbeats seen late, a
long queue, or a snapshot from before the request arrived prove nothing, however much time
passes. The clock is the test's: every `now` is given, nothing sleeps."""

from __future__ import annotations

from router.decisions import End, Fence
from router.liveness import LivenessMonitor, prefill_cleared
from router.placement import Stamp
from router.request_table import RequestTable
from router.requests import RequestHandle, RequestParams
from router.workers import WorkerState, WorkerTable
from splitserve.config import Addresses
from splitserve.protocol import (
    PROTOCOL_VERSION,
    FinishReason,
    Heartbeat,
    PrefillLoad,
    Ready,
    TransportCounters,
    WorkerInfo,
)
from splitserve.stats import Histogram

STALL = 1.0
ADDRESSES = Addresses("ipc://r", ("ipc://p",), ("ipc://d",), ("ipc://k",))


def beat(queue: int, last_seq: int, incarnation: str = "a") -> Heartbeat:
    load = PrefillLoad(queue, 10 * queue, 0, 0, Histogram().snapshot(), last_seq=last_seq)
    return Heartbeat("prefill", 0, 1, PROTOCOL_VERSION, 0.0, False, TransportCounters(),
                     prefill=load, incarnation=incarnation)  # fmt: skip


def worker(heartbeat: Heartbeat | None) -> WorkerState:
    return WorkerState("prefill", 0, "ready", incarnation="a", heartbeat=heartbeat)


class Bound:
    """A real worker table (prefill 0 ready, incarnation "a") and request table holding one
    request, sent to prefill 0 with seq 100 at t=0, under a monitor whose decisions (ends and
    fences) are recorded."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, FinishReason, str]] = []
        self.fenced: list[tuple[float, int]] = []
        self.now = 0.0
        self.workers = WorkerTable(ADDRESSES, 30.0)
        self.workers.observe(Ready("prefill", 0, 1, PROTOCOL_VERSION, WorkerInfo(), "a"))
        self.requests = RequestTable(60.0)
        self.monitor = LivenessMonitor(self.workers, self.requests, STALL)
        self.handle = RequestHandle("r", 5, RequestParams(), 0.0, 0.0, deadline=1e9,
                                    last_progress=0.0, prefill_seq=100)  # fmt: skip
        self.handle.stamp = Stamp(epoch=0, prefill=0, decode=0, detok=0)
        self.requests.add(self.handle)

    def at(self, now: float, heartbeat: Heartbeat) -> None:
        """The monitor's pass at `now`, the latest heartbeat being `heartbeat`."""
        self.now = now
        self.workers.observe(heartbeat)
        for d in self.monitor.expire_requests(now):
            if isinstance(d, End):
                self.ended.append((d.handle.request_id, d.reason, d.error))
            elif isinstance(d, Fence):
                self.fenced.append((now, d.index))


def test_no_proof_before_any_heartbeat_or_from_another_incarnation():
    assert prefill_cleared(worker(None)) is None
    assert prefill_cleared(worker(beat(0, 500, incarnation="b"))) is None
    assert prefill_cleared(worker(beat(3, 500))) is None  # still queued: no proof
    assert prefill_cleared(worker(beat(0, 500))) == 500


def test_a_long_queue_is_never_a_loss():
    b = Bound()
    for now in (0.5, 2.0, 50.0, 5000.0):
        b.at(now, beat(queue=7, last_seq=100))
    assert b.ended == []
    assert [t for t, _ in b.fenced] == [2.0, 50.0, 5000.0]  # past a stall, once a stall


def test_a_snapshot_from_before_the_request_is_no_proof_however_late_it_is_seen():
    """The failure this design replaces: an idle snapshot taken before the request arrived,
    read by a busy router long after, looked like an idle worker that had dropped it."""
    b = Bound()
    for now in (0.5, 3.0, 30.0, 3000.0):
        b.at(now, beat(queue=0, last_seq=99))
    assert b.ended == []
    assert b.fenced[-1] == (3000.0, 0)  # its worker is fenced, to prove the request gone or not


def test_proof_then_a_stall_without_the_token_is_a_loss():
    b = Bound()
    b.at(10.0, beat(queue=0, last_seq=100))  # proven at 10 s, by whatever was seen
    assert b.handle.prefill_cleared_at == 10.0
    b.at(10.0 + STALL, beat(queue=0, last_seq=120))
    assert b.ended == []  # its token may still be on its way through the detok worker
    b.at(10.0 + STALL + 0.01, beat(queue=0, last_seq=120))
    [(rid, reason, why)] = b.ended
    assert (rid, reason) == ("r", FinishReason.ERROR) and "no first token" in why


def test_fences_go_at_most_once_a_stall_per_worker():
    b = Bound()
    for now in (0.5, 1.5, 1.6, 2.0, 2.6, 3.0):
        b.at(now, beat(queue=0, last_seq=99))
    assert b.fenced == [(1.5, 0), (2.6, 0)]
    assert b.ended == []


def test_a_heartbeat_of_another_incarnation_proves_nothing():
    b = Bound()
    for now in (0.5, 5.0, 50.0):
        b.at(now, beat(queue=0, last_seq=500, incarnation="b"))  # ignored by the table
    assert b.ended == [] and b.handle.prefill_cleared_at is None
