"""The one quantile convention, and the workers' latency histograms: bucket counts for /metrics,
exact quantiles of the window."""

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.stats import BUCKETS, Histogram, quantiles


def test_quantiles_interpolate_between_ranks():
    data = list(range(1, 101))  # 1..100, shuffled order must not matter
    shuffled = data[::2] + data[1::2]
    assert quantiles(shuffled, (0.5, 0.9, 0.99)) == pytest.approx([50.5, 90.1, 99.01])
    assert quantiles(shuffled, (0.0, 1.0)) == [1, 100]
    assert quantiles([1.0, 2.0, 3.0, 4.0], (0.5,)) == [2.5]
    assert quantiles([7.0], (0.99,)) == [7.0]
    assert all(math.isnan(x) for x in quantiles([], (0.5, 0.99)))
    with pytest.raises(ValueError):
        quantiles([1.0], (1.5,))


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5),
)
def test_quantiles_lie_between_the_closest_ranks_as_numpy_computes_them(values, qs):
    ordered = sorted(values)
    got = quantiles(values, qs)
    for q, x in zip(qs, got, strict=True):
        rank = q * (len(ordered) - 1)
        lo, hi = ordered[math.floor(rank)], ordered[math.ceil(rank)]
        assert lo <= x <= hi
        assert x == pytest.approx(float(np.quantile(values, q)), rel=1e-9, abs=1e-9)


def test_snapshot_quantiles_are_those_of_the_recent_window():
    rng = random.Random(7)
    values = [rng.expovariate(200.0) for _ in range(5000)]
    h = Histogram(window=2048)
    for v in values:
        h.observe(v)
    window = values[-2048:]
    snap = h.snapshot()
    assert [snap.p50, snap.p90, snap.p99] == quantiles(window, (0.5, 0.9, 0.99))
    assert h.quantiles((0.5, 0.0)) == [quantiles(window, (0.5,))[0], min(window)]
    assert snap.count == 5000 and sum(snap.counts) == 5000
    assert len(snap.counts) == len(BUCKETS) + 1


def test_an_empty_or_single_sample_window():
    assert Histogram().snapshot().p99 == 0.0
    h = Histogram()
    h.observe(0.25)
    assert h.snapshot().p50 == h.snapshot().p99 == 0.25
