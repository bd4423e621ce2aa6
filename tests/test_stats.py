"""The workers' latency histograms: bucket counts for /metrics, exact quantiles of the window."""

import random

from splitserve.stats import BUCKETS, Histogram


def test_snapshot_quantiles_are_the_sorted_window_samples():
    rng = random.Random(7)
    values = [rng.expovariate(200.0) for _ in range(5000)]
    h = Histogram(window=2048)
    for v in values:
        h.observe(v)
    window = sorted(values[-2048:])
    snap = h.snapshot()
    assert (snap.p50, snap.p90, snap.p99) == (window[1024], window[1843], window[2027])
    assert h.quantiles((0.5, 0.0)) == [window[1024], window[0]]
    assert snap.count == 5000 and sum(snap.counts) == 5000
    assert len(snap.counts) == len(BUCKETS) + 1


def test_an_empty_or_single_sample_window():
    assert Histogram().snapshot().p99 == 0.0
    h = Histogram()
    h.observe(0.25)
    assert h.snapshot().p50 == h.snapshot().p99 == 0.25
