"""Latency figures a worker reports in its heartbeats: a fixed-bucket histogram plus a window of
recent samples for quantiles. Buckets are fixed so that the router can add up histograms."""

from __future__ import annotations

import bisect
from collections import deque

# seconds; from 100 us to 10 s
BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Histogram:
    def __init__(self, window: int = 2048):
        self.counts = [0] * (len(BUCKETS) + 1)  # last bucket: +Inf
        self.total = 0.0
        self.count = 0
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value
        self.count += 1
        self.recent.append(value)

    def quantile(self, q: float) -> float:
        return _pick(sorted(self.recent), q)

    def snapshot(self) -> dict:
        # one sort for the three quantiles: the decode loop takes a snapshot every half
        # heartbeat, between two steps, and three sorts of the window showed in its profile
        ordered = sorted(self.recent)
        return {
            "buckets": list(BUCKETS),
            "counts": list(self.counts),
            "sum": self.total,
            "count": self.count,
            "p50": _pick(ordered, 0.5),
            "p90": _pick(ordered, 0.9),
            "p99": _pick(ordered, 0.99),
        }


def _pick(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
