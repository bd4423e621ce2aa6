"""The hash ring spreads request ids evenly and moves only ~1/N of them when N changes."""

import subprocess
import sys
from collections import Counter

import pytest

from router.hashring import HashRing, stable_hash

KEYS = [f"req-{i:06d}" for i in range(100_000)]


@pytest.mark.parametrize("n", range(2, 17))
def test_balance_within_ten_percent(n):
    ring = HashRing(range(n))
    load = Counter(ring.lookup(k) for k in KEYS)
    mean = len(KEYS) / n
    assert set(load) == set(range(n))
    assert max(load.values()) / mean <= 1.10


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_adding_a_worker_moves_only_its_share(n):
    before = HashRing(range(n))
    after = HashRing(range(n + 1))
    moved = [k for k in KEYS if before.lookup(k) != after.lookup(k)]
    # every moved key moved to the new worker, and about 1/(n+1) of keys moved
    assert all(after.lookup(k) == n for k in moved)
    share = len(moved) / len(KEYS)
    assert abs(share - 1 / (n + 1)) <= 0.3 / (n + 1)


@pytest.mark.parametrize("n", [3, 8, 16])
def test_removing_a_worker_moves_only_its_keys(n):
    before = HashRing(range(n))
    gone = n // 2
    after = HashRing([w for w in range(n) if w != gone])
    moved = [k for k in KEYS if before.lookup(k) != after.lookup(k)]
    assert all(before.lookup(k) == gone for k in moved)
    share = len(moved) / len(KEYS)
    assert abs(share - 1 / n) <= 0.3 / n


def test_hash_is_stable_across_processes():
    code = "from router.hashring import stable_hash; print(stable_hash('req-000042'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == stable_hash("req-000042")


def test_empty_ring_raises():
    with pytest.raises(LookupError):
        HashRing([]).lookup("x")
