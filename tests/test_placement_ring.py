"""The detok ring follows the live workers, whatever order they joined in: it is rebuilt when the
set changes, not at every refresh (detok workers that joined as 3 then 2 rebuilt it, and logged
it, at every message)."""

from __future__ import annotations

import time

from router.placement import Placement
from router.workers import WorkerState, WorkerTable
from splitserve.config import Addresses


def test_the_ring_is_rebuilt_only_when_the_live_set_changes():
    addresses = Addresses("ipc:///tmp/r", ("ipc:///tmp/p0",), ("ipc:///tmp/d0",),
                          ("ipc:///tmp/k0", "ipc:///tmp/k1"))  # fmt: skip
    workers = WorkerTable(addresses, 60.0)
    for index in (3, 2):  # joined while serving, 3 before 2
        workers.workers[("detok", index)] = WorkerState("detok", index)
    for w in workers.workers.values():
        w.state, w.pid, w.last_seen = "ready", 1, time.monotonic()
    placement = Placement(workers, lambda d: 8, "load")
    placement.refresh()
    ring = placement.ring
    assert ring.workers == (0, 1, 2, 3)
    placement.refresh()
    assert placement.ring is ring
    workers.get("detok", 2).state = "dead"
    placement.refresh()
    assert placement.ring.workers == (0, 1, 3)
