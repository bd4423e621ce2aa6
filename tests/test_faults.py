"""The test-only fault injection of splitserve.faults: inert without SPLITSERVE_FAULTS, and each
configured fault does what its name says. A fake clock stands in for time, so nothing here
depends on how fast the machine runs."""

from __future__ import annotations

import pytest

from splitserve import faults
from splitserve.faults import DroppingSender, FaultInjector, FaultySender, parse_faults


class RecordingSender:
    """Stands in for a transport Sender: keeps what it was asked to send."""

    endpoint = "inproc://recorded"

    def __init__(self):
        self.sent: list[list[bytes]] = []
        self.closed = False

    def send_frames(self, frames):
        self.sent.append([bytes(f) for f in frames])
        return True

    def close(self):
        self.closed = True


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(faults.time, "monotonic", lambda: now[0])
    return now


def test_parse_faults():
    assert parse_faults("") == {}
    assert parse_faults("a_delay=0.3, b_reorder=1,,c_drop") == {
        "a_delay": 0.3,
        "b_reorder": 1.0,
        "c_drop": 1.0,
    }


def test_no_faults_leaves_senders_alone():
    injector = FaultInjector.from_env({"PATH": "/bin"})
    inner = RecordingSender()
    assert injector.wrap(inner, "decode_to_detok") is inner
    injector.release_due()  # nothing held, nothing to do
    assert inner.sent == []


def test_faults_apply_only_to_their_path():
    injector = FaultInjector.from_env({"SPLITSERVE_FAULTS": "prefill_to_detok_delay=0.3"})
    other = RecordingSender()
    assert injector.wrap(other, "decode_to_detok") is other
    assert isinstance(injector.wrap(RecordingSender(), "prefill_to_detok"), FaultySender)


def test_delay_holds_each_message_until_due(clock):
    injector = FaultInjector({"p_delay": 0.3})
    inner = RecordingSender()
    sender = injector.wrap(inner, "p")
    sender.send_frames([b"a"])
    clock[0] += 0.1
    sender.send_frames([b"b"])
    injector.release_due()
    assert inner.sent == []
    clock[0] += 0.2
    injector.release_due()
    assert inner.sent == [[b"a"]]
    clock[0] += 0.1
    injector.release_due()
    assert inner.sent == [[b"a"], [b"b"]]


def test_reorder_swaps_pairs_and_lets_a_lone_message_go(clock):
    injector = FaultInjector({"p_reorder": 1})
    inner = RecordingSender()
    sender = injector.wrap(inner, "p")
    for frame in (b"1", b"2", b"3"):
        sender.send_frames([frame])
    injector.release_due()
    assert inner.sent == [[b"2"], [b"1"]]  # 3 waits for a partner
    clock[0] += faults.SWAP_WAIT_S * 2
    injector.release_due()
    assert inner.sent == [[b"2"], [b"1"], [b"3"]]


def test_held_frames_are_copies(clock):
    injector = FaultInjector({"p_delay": 1})
    inner = RecordingSender()
    sender = injector.wrap(inner, "p")
    buffer = bytearray(b"xy")
    sender.send_frames([memoryview(buffer)])
    buffer[:] = b"zz"  # the caller reuses its buffer before the message goes out
    clock[0] += 2
    injector.release_due()
    assert inner.sent == [[b"xy"]]


def test_drop_loses_every_message_and_closes_the_socket():
    injector = FaultInjector({"prefill_to_decode_drop": 1})
    inner = RecordingSender()
    sender = injector.wrap(inner, "prefill_to_decode")
    assert isinstance(sender, DroppingSender)
    assert sender.send_frames([b"prefix"])
    injector.release_due()
    assert inner.sent == []
    sender.close()
    assert inner.closed
