"""Prefill from a cached prefix (Engine.prefill_cached) gives what a prefill from scratch gives:
the same greedy first token and the same KV (to float tolerance), over many prompts sharing
prefixes of random lengths, block boundaries included; the cached KV comes from another prompt
that shares those tokens, as it does from the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest

from splitserve.engine.fake.engine import FakeEngine
from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.model.prefill_continue import continue_shapes

MAX_SEQ = 128
BUCKETS = (32, 128)  # few programs: compiling is most of the time
BLOCK = 16
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def engine():
    eng = build_jax_engine("random:test-tiny:3", 2, MAX_SEQ, prefill_buckets=BUCKETS,
                           decode_buckets=BUCKETS, prefix_reuse=True)  # fmt: skip
    eng.warmup(decode=False)
    eng.programs.background.join()  # compiled after warm-up, in the background
    # what the prefill worker's load reports (PrefillLoad.prefix_compiling): none left
    assert eng.continuations_pending == 0
    assert all(key in eng.programs.compiled for key in eng.specs.continue_keys())
    return eng


def cases(seed: int, count: int):
    """(prompt, other prompt sharing its first m tokens, m): m a multiple of BLOCK below the
    prompt's length; lengths hit block boundaries (m + 1, multiples of BLOCK) and random ones."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        m = BLOCK * int(rng.integers(1, (MAX_SEQ - 2) // BLOCK))
        extra = [1, BLOCK, BLOCK + 1, int(rng.integers(1, MAX_SEQ - m))][i % 4]
        extra = min(extra, MAX_SEQ - m)
        shared = rng.integers(0, 512, m).tolist()
        prompt = shared + rng.integers(0, 512, extra).tolist()
        other = shared + rng.integers(0, 512, int(rng.integers(1, MAX_SEQ - m + 1))).tolist()
        yield prompt, other[:MAX_SEQ], m


def test_continuation_equals_scratch(engine):
    for prompt, other, m in cases(0, 40):
        scratch = engine.prefill(prompt, GREEDY)
        donor = engine.prefill(other, GREEDY)
        cached = [a[:, :m] for a in donor.kv]
        reused = engine.prefill_cached(prompt, GREEDY, cached)
        assert reused.length == scratch.length == len(prompt)
        assert (reused.cached_tokens, scratch.cached_tokens) == (m, 0)
        assert reused.first_token == scratch.first_token, (len(prompt), m)
        assert abs(reused.first_logprob - scratch.first_logprob) < 1e-4
        for a, b in zip(reused.kv, scratch.kv, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_sampled_first_token_matches(engine):
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=11)
    for prompt, other, m in cases(1, 8):
        scratch = engine.prefill(prompt, sampled)
        reused = engine.prefill_cached(prompt, sampled,
                                       [a[:, :m] for a in engine.prefill(other, GREEDY).kv])
        assert reused.first_token == scratch.first_token


def test_warmup_compiled_every_continuation(engine):
    n = len(engine.programs.compiled)
    for prompt, other, m in cases(2, 12):
        engine.prefill_cached(prompt, GREEDY, [a[:, :m] for a in engine.prefill(other, GREEDY).kv])
    assert len(engine.programs.compiled) == n, "a continuation compiled after warm-up"
    # at least 33 cached tokens and 33 new ones fit in 128; 65 and 65 would not
    assert (128, 128) in continue_shapes(BUCKETS, MAX_SEQ)
    assert (128, 128) not in continue_shapes((16, 32, 64, 128), MAX_SEQ)


def test_fake_reuse_is_exact_and_checks_the_cache():
    eng = FakeEngine(2, MAX_SEQ, 1000)
    for prompt, other, m in cases(3, 20):
        scratch = eng.prefill(prompt, GREEDY)
        reused = eng.prefill_cached(prompt, GREEDY, [eng.prefill(other, GREEDY).kv[0][:m]])
        assert (reused.first_token, reused.first_logprob) == (
            scratch.first_token, scratch.first_logprob)
        np.testing.assert_array_equal(reused.kv[0], scratch.kv[0])
        assert reused.cached_tokens == m
    with pytest.raises(ValueError, match="not this prompt's prefix"):
        eng.prefill_cached([1] * 40, GREEDY, [eng.prefill([2] * 40, GREEDY).kv[0][:16]])
