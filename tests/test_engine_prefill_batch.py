"""Batched prefill: prompts run together (padded to a (count, length) bucket within a token budget)
give the same first tokens, log-probabilities and KV caches as each run alone."""

from __future__ import annotations

import numpy as np
import pytest

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine

MAX_SEQ = 64


@pytest.fixture(scope="module")
def engine():
    eng = build_jax_engine(
        "random:test-tiny:5", 2, MAX_SEQ, prefill_buckets=(16, 32, 64), decode_buckets=(MAX_SEQ,),
        prefill_counts=(1, 2, 4), prefill_batch_tokens=64,
    )
    eng.warmup(prefill=True, decode=False)
    return eng


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 512, n)]


def test_batched_prefill_equals_one_at_a_time(engine):
    lengths = [5, 16, 1, 9, 30, 12, 3, 64, 7]
    prompts = [_prompt(i, n) for i, n in enumerate(lengths)]
    samplings = [
        SamplingParams(temperature=0.8, top_k=20, seed=i) if i % 3 else SamplingParams()
        for i in range(len(prompts))
    ]
    calls = []
    run = engine.programs.get

    def spy(key):
        if key[0] == "prefill":
            calls.append(key[1:])
        return run(key)

    engine.programs.get = spy
    try:
        together = engine.prefill_batch(prompts, samplings)
    finally:
        engine.programs.get = run
    assert len(calls) < len(prompts), "nothing was batched"
    assert all(c * t <= 64 or c == 1 for c, t in calls), calls  # within the token budget
    alone = [engine.prefill(p, s) for p, s in zip(prompts, samplings, strict=True)]
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert b.length == a.length == lengths[i]
        assert b.first_token == a.first_token, f"prompt {i}"
        np.testing.assert_allclose(b.first_logprob, a.first_logprob, atol=1e-5)
        for ka, kb in zip(a.kv, b.kv, strict=True):
            assert ka.shape == kb.shape
            np.testing.assert_allclose(kb, ka, atol=1e-5)


def test_a_batched_prefix_decodes_like_a_single_one():
    eng = build_jax_engine(
        "random:test-tiny:5", 2, MAX_SEQ, prefill_buckets=(16, 64), decode_buckets=(MAX_SEQ,),
        prefill_counts=(1, 4), prefill_batch_tokens=256,
    )
    prompts = [_prompt(20 + i, n) for i, n in enumerate((11, 40, 2))]
    batched = eng.prefill_batch(prompts, [SamplingParams()] * 3)[1]
    single = eng.prefill(prompts[1], SamplingParams())

    def decode(prefix):
        eng.insert(prefix, 0, SamplingParams())
        out = [int(eng.generate().tokens[0]) for _ in range(8)]
        eng.free(0)
        return out

    assert decode(batched) == decode(single)


def test_a_lone_prompt_pads_to_the_finer_lengths_with_the_same_prefix():
    """Engine defaults: a 136-token prompt runs the 160-token pass, not the 256 its power of
    two would take, and gets the prefix (first token, log-probability, KV) it gets there."""
    fine = build_jax_engine("random:test-tiny:5", 1, 256, decode_buckets=(256,))
    coarse = build_jax_engine("random:test-tiny:5", 1, 256, decode_buckets=(256,),
                              prefill_buckets=(16, 32, 64, 128, 256))  # fmt: skip
    prompt = _prompt(7, 136)
    assert fine.prefill_runner.shape([np.asarray(prompt)]) == (1, 160)
    assert coarse.prefill_runner.shape([np.asarray(prompt)]) == (1, 256)
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=3)):
        a, b = fine.prefill(prompt, sampling), coarse.prefill(prompt, sampling)
        assert ("prefill", 1, 160) in fine.programs.compiled
        assert (a.length, a.first_token) == (b.length, b.first_token) == (136, b.first_token)
        np.testing.assert_allclose(a.first_logprob, b.first_logprob, atol=1e-5)
        for ka, kb in zip(a.kv, b.kv, strict=True):
            assert ka.shape == kb.shape
            np.testing.assert_allclose(ka, kb, atol=1e-5)


def test_bad_prompt_in_a_batch_is_a_value_error(engine):
    with pytest.raises(ValueError):
        engine.prefill_batch([[1, 2], []], [SamplingParams()] * 2)
    with pytest.raises(ValueError):
        engine.prefill_batch([[1, 2]], [])
