"""Sampling: exact top-k / top-p sets without a sort, the right distribution, and draws that
depend only on (seed, output position, logits)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.engine.jax import sampling

V = 16
_sample = jax.jit(sampling.sample)
_greedy = jax.jit(sampling.greedy)
_top_k_mask = jax.jit(sampling._top_k_mask)
_top_p_mask = jax.jit(sampling._top_p_mask)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _run(logits, temperature, top_k, top_p, seeds, positions):
    n = logits.shape[0]
    full = lambda v, dt: np.broadcast_to(np.asarray(v, dt), (n,))
    tok, lp = _sample(
        jnp.asarray(logits, jnp.float32),
        full(temperature, np.float32),
        full(top_k, np.int32),
        full(top_p, np.float32),
        full(seeds, np.uint32),
        full(positions, np.int32),
    )
    return np.asarray(tok), np.asarray(lp)


def test_greedy_picks_the_first_of_tied_maxima():
    logits = np.zeros((3, 200), np.float32)
    logits[0, [150, 70, 199]] = 5.0  # ties in different 64-wide blocks
    logits[1, [3, 4]] = 1.0  # ties in one block
    logits[2, 199] = 2.0  # the last, padded block
    tok, lp = _greedy(logits)
    np.testing.assert_array_equal(np.asarray(tok), [70, 3, 199])
    np.testing.assert_allclose(
        np.asarray(lp), _log_softmax(logits)[np.arange(3), [70, 3, 199]], atol=1e-6
    )


def test_greedy_is_argmax_with_unscaled_logprob():
    logits = np.random.default_rng(0).standard_normal((5, V)).astype(np.float32)
    tok, lp = _greedy(logits)
    np.testing.assert_array_equal(np.asarray(tok), logits.argmax(-1))
    want = _log_softmax(logits)[np.arange(5), logits.argmax(-1)]
    np.testing.assert_allclose(np.asarray(lp), want, atol=1e-5)
    # temperature 0 in the full variant is greedy too
    tok2, lp2 = _run(logits, 0.0, 0, 1.0, 7, 3)
    np.testing.assert_array_equal(tok2, logits.argmax(-1))
    np.testing.assert_allclose(lp2, want, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.integers(-4, 4), min_size=V, max_size=V),  # small ints: many ties
    k=st.integers(0, V + 2),
)
def test_top_k_mask_keeps_exactly_values_at_least_kth(values, k):
    z = np.asarray(values, np.float32)[None] * np.float32(0.75)
    mask = np.asarray(_top_k_mask(z, np.array([k], np.int32)))[0]
    kth = np.sort(z[0])[::-1][min(k, V) - 1] if 0 < k else -np.inf
    np.testing.assert_array_equal(mask, z[0] >= kth)


@settings(max_examples=60, deadline=None)
@given(
    raw=st.lists(st.floats(0.0, 1.0), min_size=V, max_size=V).filter(lambda r: sum(r) > 0.1),
    top_p=st.floats(0.01, 1.0),
)
def test_top_p_mask_is_the_smallest_nucleus(raw, top_p):
    probs = np.asarray(raw, np.float32)
    probs /= probs.sum()
    mask = np.asarray(_top_p_mask(probs[None], np.array([top_p], np.float32)))[0]
    if top_p >= 1.0:
        assert mask.all()
        return
    # Sorted descending, a token is in the nucleus iff the mass strictly before it is < top_p
    # (ties at the boundary value all kept). Check against that, away from float rounding.
    kept = probs[mask]
    assert kept.sum() >= top_p - 1e-5
    threshold = kept.min()
    assert np.all(probs[~mask] < threshold)
    above = probs[probs > threshold].sum()
    assert above < top_p + 1e-5  # dropping the boundary value would fall short


def test_samples_follow_the_softmax_distribution():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, -3.0, -8.0], np.float32)
    n = 20000
    rows = np.broadcast_to(logits, (n, logits.size))
    tok, lp = _run(rows, 1.0, 0, 1.0, np.arange(n), 0)
    freq = np.bincount(tok, minlength=logits.size) / n
    want = np.exp(_log_softmax(logits))
    assert np.abs(freq - want).max() < 0.015
    np.testing.assert_allclose(lp, _log_softmax(logits)[tok], atol=1e-5)
    # temperature 0.5 sharpens: the distribution of logits / 0.5, and the logprobs are its own
    tok, lp = _run(rows, 0.5, 0, 1.0, np.arange(n), 0)
    freq = np.bincount(tok, minlength=logits.size) / n
    assert np.abs(freq - np.exp(_log_softmax(logits / 0.5))).max() < 0.015
    np.testing.assert_allclose(lp, _log_softmax(logits / 0.5)[tok], atol=1e-5)


def test_sampled_logprobs_are_those_of_the_drawn_distribution():
    """vLLM's processed logprobs: after temperature, top-k (renormalised over the k kept) and
    top-p (over the nucleus), numpy-computed here; greedy rows keep their raw logprobs."""
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((300, 40)) * 2).astype(np.float32)
    temps = np.where(np.arange(300) % 4 == 0, 0.0, 0.8).astype(np.float32)
    tok, lp = _run(logits, temps, 6, 0.7, np.arange(300), 1)
    for row, t, temp, got in zip(logits, tok, temps, lp, strict=True):
        if temp == 0:
            assert got == pytest.approx(_log_softmax(row)[t], abs=1e-5)
            continue
        z = row / temp
        order = np.argsort(-z)[:6]  # top-k 6, then the nucleus of mass 0.7 among them
        p = np.exp(z[order] - z[order].max())
        p /= p.sum()
        nucleus = order[np.concatenate([[0.0], np.cumsum(p)[:-1]]) < 0.7]
        assert t in nucleus
        kept = z[nucleus]
        want = z[t] - (kept.max() + np.log(np.exp(kept - kept.max()).sum()))
        assert got == pytest.approx(want, abs=1e-4)


def test_filters_never_leak_and_top_k_one_is_greedy():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((400, 50)).astype(np.float32) * 2
    tok, _ = _run(logits, 1.3, 5, 1.0, np.arange(400), 9)
    top5 = np.argsort(-logits, axis=-1)[:, :5]
    assert all(t in row for t, row in zip(tok, top5, strict=True))
    tok, _ = _run(logits, 1.0, 1, 1.0, np.arange(400), 9)
    np.testing.assert_array_equal(tok, logits.argmax(-1))
    tok, _ = _run(logits, 1.0, 0, 1e-6, np.arange(400), 9)
    np.testing.assert_array_equal(tok, logits.argmax(-1))
    # top-p 0.5 after top-k 10: only tokens in the nucleus of the top-10 renormalised
    tok, _ = _run(logits, 0.7, 10, 0.5, np.arange(400), 2)
    for row, t in zip(logits, tok, strict=True):
        z = row / 0.7
        order = np.argsort(-z)[:10]
        p = np.exp(z[order] - z[order].max())
        p /= p.sum()
        before = np.concatenate([[0.0], np.cumsum(p)[:-1]])
        assert t in order[before < 0.5 + 1e-5]


def test_draw_depends_only_on_seed_position_and_logits():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((8, 64)).astype(np.float32)
    seeds = np.arange(100, 108)
    positions = np.arange(8) * 3
    tok, lp = _run(logits, 0.9, 20, 0.95, seeds, positions)
    perm = rng.permutation(8)
    tok_p, lp_p = _run(logits[perm], 0.9, 20, 0.95, seeds[perm], positions[perm])
    np.testing.assert_array_equal(tok_p, tok[perm])
    np.testing.assert_array_equal(lp_p, lp[perm])
    # other rows' parameters (greedy neighbours) do not matter either
    temps = np.where(np.arange(8) % 2 == 0, 0.9, 0.0).astype(np.float32)
    tok_m, _ = _run(logits, temps, 20, 0.95, seeds, positions)
    np.testing.assert_array_equal(tok_m[::2], tok[::2])
    # and a different position or seed gives a different stream
    tok_b, _ = _run(np.repeat(logits[:1], 64, 0), 5.0, 0, 1.0, 1, np.arange(64))
    assert len(set(tok_b.tolist())) > 10
