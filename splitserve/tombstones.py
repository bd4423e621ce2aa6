"""Request ids that are gone (aborted, finished) remembered for a while, so that messages still in
flight for them (a late prefix, late tokens) are dropped instead of creating new state.

Each id is remembered with the newest placement epoch that is gone: a message of that epoch or an
older one is dropped (covers), while one of a newer epoch (the request moved here after a worker
died) is taken. Bounded by time: entries older than the TTL are forgotten.
"""

from __future__ import annotations

import time
from collections import OrderedDict


class Tombstones:
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._gone: OrderedDict[str, tuple[float, int]] = OrderedDict()  # id -> (when, epoch)

    def add(self, request_id: str, epoch: int = 0) -> None:
        previous = self._gone.pop(request_id, None)
        if previous is not None:
            epoch = max(epoch, previous[1])
        self._gone[request_id] = (time.monotonic(), epoch)

    def covers(self, request_id: str, epoch: int) -> bool:
        """Whether a message of this epoch for this id is for a request that is gone."""
        entry = self._gone.get(request_id)
        return entry is not None and epoch <= entry[1]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._gone

    def __len__(self) -> int:
        return len(self._gone)

    def prune(self) -> None:
        horizon = time.monotonic() - self.ttl_s
        while self._gone:
            rid, (when, _) = next(iter(self._gone.items()))
            if when > horizon:
                break
            self._gone.popitem(last=False)
