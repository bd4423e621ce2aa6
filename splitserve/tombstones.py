"""Request ids that are gone (aborted, finished) remembered for a while, so that messages still in
flight for them (a late prefix, late tokens) are dropped instead of creating new state.
Bounded by time: entries older than the TTL are forgotten."""

from __future__ import annotations

import time
from collections import OrderedDict


class Tombstones:
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._when: OrderedDict[str, float] = OrderedDict()

    def add(self, request_id: str) -> None:
        self._when.pop(request_id, None)
        self._when[request_id] = time.monotonic()

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._when

    def __len__(self) -> int:
        return len(self._when)

    def prune(self) -> None:
        horizon = time.monotonic() - self.ttl_s
        while self._when:
            rid, when = next(iter(self._when.items()))
            if when > horizon:
                break
            self._when.popitem(last=False)
