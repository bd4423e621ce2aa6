"""Where a request goes, decided once at admission and stamped on it: its detok worker is the
hash ring's choice over the live detok workers (splitserve.hashring), by request id.

The ring is rebuilt whenever the set of live detok workers changes; requests already running keep
the worker stamped on them. Later hops only read the stamp.
"""

from __future__ import annotations

import logging

from router.workers import WorkerTable
from splitserve.hashring import HashRing

log = logging.getLogger(__name__)


class Placement:
    def __init__(self, workers: WorkerTable):
        self.workers = workers
        self.ring = HashRing([])

    def refresh(self) -> None:
        """Follow the live detok workers (call when a worker's state may have changed)."""
        live = self.workers.live_detoks()
        if tuple(live) != self.ring.workers:
            self.ring = HashRing(live)
            log.info("hash ring over detok workers %s", live)

    def detok_for(self, request_id: str) -> int:
        return self.ring.lookup(request_id)
