"""Latency figures a worker reports in its heartbeats: a fixed-bucket histogram plus a window of
recent samples for quantiles. Buckets are fixed so that the router can add up histograms."""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from splitserve.protocol import HistogramSnapshot

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

    def quantiles(self, qs: tuple[float, ...]) -> list[float]:
        """Exact quantiles of the recent window (the sample at index int(q * n) of the sorted
        window). A partial sort in numpy: the decode loop takes a snapshot between two steps
        every half heartbeat, and sorting 2,048 floats in Python took 0.27 ms of that gap."""
        n = len(self.recent)
        if not n:
            return [0.0] * len(qs)
        ranks = [min(n - 1, int(q * n)) for q in qs]
        window = np.partition(np.fromiter(self.recent, np.float64, n), ranks)
        return [float(window[r]) for r in ranks]

    def snapshot(self) -> HistogramSnapshot:
        p50, p90, p99 = self.quantiles((0.5, 0.9, 0.99))
        return HistogramSnapshot(
            list(BUCKETS), list(self.counts), self.total, self.count, p50, p90, p99
        )
