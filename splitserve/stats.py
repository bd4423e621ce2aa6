"""Latency figures: the one quantile function every figure of the project uses, and the
fixed-bucket histogram plus window of recent samples a worker reports in its heartbeats. Buckets
are fixed so that the router can add up histograms."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from splitserve.protocol import HistogramSnapshot

# seconds; from 100 us to 10 s
BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


def quantiles(values: Sequence[float] | np.ndarray, qs: Sequence[float]) -> list[float]:
    """The q-quantiles (0 <= q <= 1) of `values`, in any order; NaN for each when there are none.

    One convention everywhere: linear interpolation between the closest ranks (numpy's default,
    "linear"), at rank q * (n - 1) of the sorted values. So p50 of [1, 2, 3, 4] is 2.5 (the
    median), p0 is the minimum and p100 the maximum. A partial sort, not a whole one: the decode
    loop takes a snapshot of its histograms between two steps, so their cost is a step's
    delay.
    """
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} outside [0, 1]")
    n = len(values)
    if not n:
        return [math.nan] * len(qs)
    ranks = [q * (n - 1) for q in qs]
    lows = [math.floor(r) for r in ranks]
    highs = [min(lo + 1, n - 1) for lo in lows]
    part = np.partition(np.asarray(values, np.float64), sorted(set(lows + highs)))
    return [
        float(part[lo] + (part[hi] - part[lo]) * (rank - lo))
        for rank, lo, hi in zip(ranks, lows, highs, strict=True)
    ]


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
        """Exact quantiles of the recent window (see quantiles()); 0.0 while it is empty."""
        n = len(self.recent)
        if not n:
            return [0.0] * len(qs)
        return quantiles(np.fromiter(self.recent, np.float64, n), qs)

    def snapshot(self) -> HistogramSnapshot:
        p50, p90, p99 = self.quantiles((0.5, 0.9, 0.99))
        return HistogramSnapshot(
            list(BUCKETS), list(self.counts), self.total, self.count, p50, p90, p99
        )
