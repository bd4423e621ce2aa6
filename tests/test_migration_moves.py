"""Which move a lost detok worker gets: a request whose decode worker holds it moves only its
stream (Repin), but a resumed request whose prefill is still running is placed anew, because
that prefill sends its first token to the detok worker it was stamped with (a two-host run lost
two streams that way: the new detok worker waited for a token that went to the old one)."""

from __future__ import annotations

import time
from array import array

from router.decisions import Prefill, Send
from router.migration import Migrator
from router.placement import Placement
from router.request_table import RequestTable
from router.requests import RequestHandle, RequestParams
from router.workers import WorkerTable
from splitserve.config import Addresses, RouterConfig
from splitserve.protocol import DetokParams, GenerateRequest, Repin, StopCriteria
from splitserve.protocol.params import SamplingParams


class RecordedLinks:
    """What the migrator decides to send, by role (the router core sends it; the transport
    itself is tested elsewhere)."""

    def __init__(self):
        self.sent: list[tuple[str, int, object]] = []

    def record(self, decisions) -> None:
        for d in decisions:
            if isinstance(d, Send):
                self.sent.append((d.role, d.index, d.message))
            elif isinstance(d, Prefill):
                self.sent.append(("prefill", d.index, d.message))


def _migrator():
    addresses = Addresses("ipc:///tmp/r", ("ipc:///tmp/p0",), ("ipc:///tmp/d0",),
                          ("ipc:///tmp/k0", "ipc:///tmp/k1"))  # fmt: skip
    workers = WorkerTable(addresses, 60.0)
    for w in workers.workers.values():
        w.state, w.pid, w.last_seen = "ready", 1, time.monotonic()
    placement = Placement(workers, lambda d: 4, "load")
    placement.refresh()
    requests, links = RequestTable(60.0), RecordedLinks()
    migrator = Migrator(RouterConfig(), requests, placement)
    return migrator, placement, workers, requests, links


def _streaming_handle(placement, requests, tokens: int) -> RequestHandle:
    now = time.monotonic()
    handle = RequestHandle("r1", 3, RequestParams(max_tokens=300), now, now, now + 600)
    handle.message = GenerateRequest("r1", 0, 0, 1, [5, 6, 7], 0, SamplingParams(),
                                     StopCriteria(max_tokens=300), DetokParams())  # fmt: skip
    requests.add(handle)
    placement.place(handle, 0, [5, 6, 7])
    placement.prefilled(handle)  # its first token came
    handle.token_ids = array("i", range(tokens))
    handle.completion_tokens = tokens
    return handle


def _lose_its_detok(migrator, workers, handle, links):
    lost = workers.get("detok", handle.stamp.detok)
    lost.state = "dead"
    links.record(migrator.worker_lost(lost))


def test_a_decoding_request_moves_only_its_stream():
    migrator, placement, workers, requests, links = _migrator()
    handle = _streaming_handle(placement, requests, 41)
    _lose_its_detok(migrator, workers, handle, links)
    assert [role for role, _, _ in links.sent] == ["detok", "decode"]
    assert isinstance(links.sent[1][2], Repin)


def test_a_resumed_request_still_in_prefill_is_placed_anew():
    migrator, placement, workers, requests, links = _migrator()
    handle = _streaming_handle(placement, requests, 41)
    links.record(migrator.move(handle, "decode", "decode worker 0 died"))  # prefilled again
    assert handle.prefill_pending and [r for r, _, _ in links.sent] == ["detok", "prefill"]
    links.sent.clear()
    _lose_its_detok(migrator, workers, handle, links)
    # prefilled again, its first token stamped for the live detok worker; no Repin
    (_, _, resume), (role, _, resent) = links.sent
    assert role == "prefill" and resent.detok_index == handle.stamp.detok
    assert resent.epoch == handle.stamp.epoch == 2
    assert workers.get("detok", handle.stamp.detok).state == "ready"
    assert not any(isinstance(m, Repin) for _, _, m in links.sent)


def test_a_lost_prefill_worker_takes_a_resumed_request_in_its_queue_along():
    migrator, placement, workers, requests, links = _migrator()
    handle = _streaming_handle(placement, requests, 41)
    links.record(migrator.move(handle, "decode", "decode worker 0 died"))
    links.sent.clear()
    lost = workers.get("prefill", 0)
    lost.state = "dead"
    links.record(migrator.worker_lost(lost))
    # no other prefill worker: it waits for one (not left on the dead worker's queue)
    assert handle.request_id in migrator.waiting
