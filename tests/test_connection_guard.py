"""ConnectionGuard's bookkeeping on its own (router/http/connections.py), with stand-ins for the
protocol objects and a clock the test moves: which connection makes room, when one is refused,
when one times out. The real server under floods is tests/test_http_slowloris.py."""

from __future__ import annotations

import asyncio

import pytest

from router.http import connections
from router.http.connections import HEADERS, QUIET, UPLOADING, ConnectionGuard
from splitserve.config import RouterConfig


class Conn:
    """What the guard uses of a GuardedProtocol."""

    def __init__(self, peer: str):
        self.peer = peer
        self.counted = False
        self.closed = False
        self.unread = False  # bytes in the kernel that the server has not read yet

    def close_quietly(self) -> None:
        self.closed = True

    def has_unread_bytes(self) -> bool:
        return self.unread


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(connections.time, "monotonic", lambda: now[0])
    return now


def guarded(test):
    """Run test(guard) on an event loop (the guard schedules its sweeps on one)."""
    cfg = RouterConfig(header_timeout_s=10, body_timeout_s=30, max_connections=6,
                       max_connections_per_peer=3, max_running=1, max_queued=0)  # fmt: skip

    async def body():
        guard = ConnectionGuard(cfg)
        try:
            test(guard)
        finally:
            guard.close()

    asyncio.run(body())


def test_a_peer_at_its_limit_is_refused_and_keeps_what_it_has(clock):
    """Refused, not made room for: a peer reconnecting in a loop would otherwise close its own
    connections as fast as it opened new ones (a churn that slowed everyone)."""

    def test(guard):
        a = [Conn("a") for _ in range(3)]
        for c in a:
            clock[0] += 100
            assert guard.admit(c) is None
            guard.mark(c, HEADERS)
        guard.busy(a[0])
        assert guard.admit(Conn("a")) == "peer"
        assert not any(c.closed for c in a)
        assert guard.admit(Conn("b")) is None  # other addresses are not
        assert guard.by_peer == {"a": 3, "b": 1}

    guarded(test)


def test_at_the_total_limit_the_address_with_most_waiting_loses_one(clock):
    def test(guard):
        normal = Conn("normal")
        clock[0] += 1
        guard.admit(normal)  # the longest waiting of all, but its address's only one
        flood = [Conn(f"f{i % 2}") for i in range(5)]
        for c in flood:
            clock[0] += 1
            guard.admit(c)
        assert guard.open == 6
        assert guard.admit(Conn("new")) is None
        assert not normal.closed
        assert [c.closed for c in flood] == [True, False, False, False, False]  # f0's oldest

    guarded(test)


def test_at_the_total_limit_with_every_connection_busy_a_new_one_is_refused(clock):
    def test(guard):
        for i in range(6):
            c = Conn(f"p{i}")
            guard.admit(c)
            guard.busy(c)
        assert guard.admit(Conn("late")) == "total"
        assert guard.open == 6

    guarded(test)


def test_timeouts_by_state(clock):
    def test(guard):
        headers, body, served = Conn("a"), Conn("b"), Conn("c")
        for c in (headers, body, served):
            guard.admit(c)
        guard.mark(body, UPLOADING)
        guard.busy(served)
        clock[0] += 11  # past the header timeout, not the body's
        guard.sweep()
        assert (headers.closed, body.closed, served.closed) == (True, False, False)
        clock[0] += 15
        guard.mark(body, UPLOADING)  # progress: its clock starts again
        clock[0] += 29
        guard.sweep()
        assert not body.closed
        clock[0] += 2
        guard.sweep()
        assert body.closed and not served.closed
        assert guard.open == 1

    guarded(test)


def test_a_freed_keep_alive_connection_waits_from_its_response(clock):
    def test(guard):
        c = Conn("a")
        guard.admit(c)
        guard.busy(c)
        clock[0] += 100  # a long response
        guard.mark(c, QUIET)
        clock[0] += 9
        guard.sweep()
        assert not c.closed
        clock[0] += 2
        guard.sweep()
        assert c.closed

    guarded(test)


def test_forget_is_once(clock):
    def test(guard):
        c = Conn("a")
        guard.admit(c)
        guard.forget(c)
        guard.forget(c)  # the guard closed it, then its connection_lost came
        assert guard.open == 0 and guard.by_peer == {} and not guard.waiting
        assert guard.peer_queues == {} and guard.queues == {True: {}, False: {}}

    guarded(test)


def test_an_upload_under_way_makes_room_only_after_every_waiting_connection(clock):
    """A flood churning at the total holds mostly fresh, quiet connections; a normal client's
    one upload, between its headers and its body, used to be the first to go."""

    def test(guard):
        upload = Conn("normal")
        guard.admit(upload)  # the oldest of all, and its address's only one
        guard.mark(upload, HEADERS)
        guard.mark(upload, UPLOADING)
        waiting = [Conn(f"f{i % 3}") for i in range(5)]
        for i, c in enumerate(waiting):
            clock[0] += 1
            guard.admit(c)
            if i % 2:
                guard.mark(c, HEADERS)  # trickling
        for i in range(len(waiting)):
            new = Conn(f"n{i}")
            assert guard.admit(new) is None
            assert not upload.closed
            guard.busy(new)  # its whole request came at once
        assert all(c.closed for c in waiting)
        assert guard.admit(Conn("late")) is None  # no connection waits: the upload goes
        assert upload.closed

    guarded(test)


def test_quiet_and_trickling_connections_make_room_by_age(clock):
    """A connection that begins its headers keeps its age: a slowloris trickling headers is no
    younger than when it connected."""

    def test(guard):
        trickling = [Conn(f"t{i}") for i in range(3)]
        for c in trickling:
            clock[0] += 1
            guard.admit(c)
        quiet = [Conn(f"q{i}") for i in range(3)]
        for c in quiet:
            clock[0] += 1
            guard.admit(c)
        for c in trickling:
            guard.mark(c, HEADERS)  # after the quiet ones connected
        assert guard.admit(Conn("new")) is None
        assert [c.closed for c in trickling + quiet] == [True] + [False] * 5

    guarded(test)


def test_headers_are_timed_from_when_the_connection_became_free(clock):
    def test(guard):
        c = Conn("a")
        guard.admit(c)
        clock[0] += 9
        guard.mark(c, HEADERS)  # the first byte, 9 s in: 1 s left
        clock[0] += 2
        guard.sweep()
        assert c.closed

    guarded(test)


def test_a_connection_whose_bytes_wait_unread_is_not_timed_out(clock):
    """Its client sent in time; the server's loop, running late on a loaded machine, has not read
    the bytes yet: the delay is the server's, and the connection gets one timeout more."""

    def test(guard):
        c = Conn("a")
        guard.admit(c)
        c.unread = True
        clock[0] += 11  # past the header timeout
        guard.sweep()
        assert not c.closed
        c.unread = False  # read now, and still no whole header: the client's stall after all
        guard.sweep()
        assert c.closed
        trickler = Conn("b")
        guard.admit(trickler)
        trickler.unread = True  # always a byte unread: no way around the timeout for long
        clock[0] += 19
        guard.sweep()
        assert not trickler.closed
        clock[0] += 2  # past two timeouts
        guard.sweep()
        assert trickler.closed

    guarded(test)
