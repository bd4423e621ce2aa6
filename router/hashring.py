"""Consistent hashing of request ids onto detok workers.

Each worker owns many virtual nodes on a 64-bit ring; a request id belongs to the first virtual node
clockwise from its hash. The hash is blake2b (stable across processes and runs, unlike Python's
salted hash()). Adding or removing a worker moves only the keys of that worker's arcs, about 1/N.
The router computes the assignment once per request and stamps it on the request.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable

DEFAULT_VNODES = 2048  # enough that each worker's share of the request ids stays close to 1/N


def stable_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, workers: Iterable[int], vnodes: int = DEFAULT_VNODES):
        self.workers = tuple(sorted(set(workers)))
        points = []
        for w in self.workers:
            for v in range(vnodes):
                points.append((stable_hash(f"detok-{w}#{v}"), w))
        points.sort()
        self._hashes = [h for h, _ in points]
        self._owners = [w for _, w in points]

    def __len__(self) -> int:
        return len(self.workers)

    def lookup(self, request_id: str) -> int:
        if not self._hashes:
            raise LookupError("no live detok worker")
        i = bisect.bisect_right(self._hashes, stable_hash(request_id))
        return self._owners[i % len(self._owners)]
