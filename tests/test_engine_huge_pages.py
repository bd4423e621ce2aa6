"""The engines' weights on huge pages (engine/kernels/huge_pages.py): which ranges are asked for,
and that what the kernel says it moved is on huge pages with the values unchanged."""

from __future__ import annotations

import logging

import jax.numpy as jnp
import numpy as np
import pytest

from splitserve.engine.kernels.huge_pages import HUGE_PAGE, collapse, joined, whole_pages

MB = 1 << 20
NOTHING_MOVED = "the kernel moved nothing (no MADV_COLLAPSE or THP here, or no free 2 MiB page)"


def test_only_whole_huge_pages_inside_a_range_are_asked_for():
    assert whole_pages(0, 4 * MB) == (0, 4 * MB)
    assert whole_pages(100, 4 * MB) == (2 * MB, 2 * MB)  # ragged ends stay on small pages
    assert whole_pages(100, 3 * MB) == (2 * MB, 0)
    assert whole_pages(2 * MB - 64, 4 * MB + 64) == (2 * MB, 4 * MB)


def test_ranges_on_touching_pages_are_joined_and_apart_ones_are_not():
    # two matrices of 1.5 MB each, the second 64 bytes after the first one's last page: one run
    a = (0x1010_0040, int(1.5 * MB))  # 1 MiB past a huge page's start
    b = (a[0] + a[1] + 4096 + 64, int(1.5 * MB))
    far = (0x2000_0000, MB)
    assert joined([far, b, a]) == [(a[0], b[0] + b[1] - a[0]), far]
    # joined, they hold a whole huge page that neither holds alone
    assert whole_pages(*a)[1] == whole_pages(*b)[1] == 0
    assert whole_pages(*joined([a, b])[0])[1] == HUGE_PAGE
    inside = (a[0] + 100, 10)
    assert joined([a, inside]) == [a]


def _huge_kb_at(address: int) -> int | None:
    """AnonHugePages of the mapping holding `address`, from /proc/self/smaps."""
    found = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                found = lo <= address < hi
            elif found and head == "AnonHugePages:":
                return int(line.split()[1])
    return None


def test_what_the_kernel_moves_is_on_huge_pages_with_the_same_values():
    rng = np.random.default_rng(0)
    host = rng.standard_normal((4096, 2048), dtype=np.float32)  # 32 MiB
    weights = jnp.asarray(host) + 0  # an array of XLA's own, as the engine's parameters are
    address = weights.unsafe_buffer_pointer()
    moved = collapse([{"w": weights}])
    if not moved:
        pytest.skip(NOTHING_MOVED)
    start, length = whole_pages(address, weights.nbytes)
    assert moved == length >= 14 * MB
    assert weights.unsafe_buffer_pointer() == address
    assert (_huge_kb_at(start) or 0) * 1024 >= HUGE_PAGE
    np.testing.assert_array_equal(np.asarray(weights), host)
    product = np.asarray(weights @ jnp.ones(2048, jnp.float32))
    np.testing.assert_allclose(product, host.astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("huge", [True, False])
def test_the_model_setting_reaches_the_engine_weights(huge, caplog):
    """[model] huge_pages through build_engine, as a worker builds its engine: with it the
    7M checkpoint's 8 MB embedding is on huge pages and the engine says how much it moved;
    without it nothing is asked for. (Whether memory is on huge pages without the setting is
    not for this test to say: the allocator may reuse pages an earlier collapse made huge.)"""
    from splitserve.config import config_from_dict, config_to_dict
    from splitserve.engine import build_engine

    probe = jnp.ones((1024, 4096), jnp.float32) + 0  # 16 MiB: can this kernel move memory?
    if not collapse([probe]):
        pytest.skip(NOTHING_MOVED)
    raw = {"model": {"path": "random:tiny-7m", "num_slots": 2, "max_seq_len": 64,
                     "huge_pages": huge}, "cluster": {"run_dir": "/tmp/x"}}  # fmt: skip
    model = config_from_dict(config_to_dict(config_from_dict(raw))).model
    assert model.huge_pages is huge
    caplog.clear()
    logger = "splitserve.engine.kernels.huge_pages"
    with caplog.at_level(logging.INFO, logger=logger):
        engine = build_engine(model, 8000, role="decode")
    said = [r.getMessage() for r in caplog.records if r.name == logger]
    if not huge:
        assert said == []
        return
    assert len(said) == 1 and said[0].startswith("weights on huge pages:"), said
    embed = engine.decode_params["embed"]
    start, length = whole_pages(embed.unsafe_buffer_pointer(), embed.nbytes)
    assert length >= 4 * MB
    assert (_huge_kb_at(start) or 0) * 1024 >= HUGE_PAGE
