"""Several decode steps per dispatch (generate_many) give exactly what as many single steps give,
greedy and seeded, in any batch bucket; the engine's host state follows (the next step goes on
from there)."""

from __future__ import annotations

import numpy as np
import pytest

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine

SLOTS, MAX_SEQ, K = 4, 64, 4


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 512, n)]


@pytest.fixture(scope="module")
def engine():
    eng = build_jax_engine(
        "random:test-tiny:9", SLOTS, MAX_SEQ, prefill_buckets=(16, 64), decode_buckets=(32, 64),
        decode_steps=(K,),
    )
    return eng  # no warmup: compiling only the shapes used keeps this module quick


@pytest.mark.parametrize("live", [1, 3])
def test_many_steps_per_call_equal_single_steps(engine, live):
    samplings = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=7),
                 SamplingParams(temperature=1.2, top_k=10, seed=8)][:live]
    prefixes = [engine.prefill(_prompt(s, 10 + 5 * s), sp) for s, sp in enumerate(samplings)]

    def fill():
        for s in range(SLOTS):
            engine.free(s)
        for s, (p, sp) in enumerate(zip(prefixes, samplings, strict=True)):
            engine.insert(p, s + 1, sp)  # slots 1.., so rows and slots differ

    fill()
    single = [engine.generate() for _ in range(3 * K)]
    fill()
    many = [engine.generate_many(K) for _ in range(3)]  # 10 + 5s + 12 positions: grows to 64
    tokens = np.concatenate([m.tokens for m in many])
    logprobs = np.concatenate([m.logprobs for m in many])
    for s in range(1, live + 1):
        np.testing.assert_array_equal(tokens[:, s], [o.tokens[s] for o in single])
        np.testing.assert_allclose(logprobs[:, s], [o.logprobs[s] for o in single], atol=1e-5)
    after_many = engine.generate().tokens
    fill()
    for _ in range(3 * K):
        engine.generate()
    np.testing.assert_array_equal(after_many[1:live + 1], engine.generate().tokens[1:live + 1])


def test_uncompiled_step_count_is_refused(engine):
    with pytest.raises(ValueError):
        engine.generate_many(K + 1)


def test_k_step_programs_only_up_to_the_live_bound():
    """decode_steps_max_live: the k-step programs exist for the batch buckets that hold that
    many live slots only, and generate_many is refused above it (the worker steps one at a
    time there); at or below it, it runs as before."""
    eng = build_jax_engine(
        "random:test-tiny:9", SLOTS, MAX_SEQ, prefill_buckets=(16, 64), decode_buckets=(32, 64),
        decode_steps=(K,), decode_steps_max_live=1,
    )
    decode = [k for k in eng.specs.keys(prefill=False) if k[0] == "decode"]
    assert {(b, k) for _, b, _, k in decode} == {(1, 1), (2, 1), (4, 1), (1, K)}
    prefix = eng.prefill(_prompt(3, 12), SamplingParams())
    eng.insert(prefix, 2, SamplingParams())
    alone = eng.generate_many(K).tokens[:, 2]
    eng.insert(prefix, 0, SamplingParams())
    with pytest.raises(ValueError, match="at most 1 live"):
        eng.generate_many(K)
    eng.free(0)
    eng.free(2)
    eng.insert(prefix, 2, SamplingParams())
    np.testing.assert_array_equal([eng.generate().tokens[2] for _ in range(K)], alone)


def test_k_step_programs_compile_after_ready_and_single_steps_stand_in():
    """A cold warm-up leaves the k-step programs for after Ready (deferred_keys): until one is
    here, generate_many runs single steps (the same tokens, nothing compiled on the way), and
    multi_step_ready says so (the worker counts them as steps); then the k-step program runs."""
    eng = build_jax_engine(
        "random:test-tiny:9", 2, MAX_SEQ, prefill_buckets=(16, 64), decode_buckets=(32, 64),
        decode_steps=(K,),
    )  # two slots: few programs to compile
    eng.warmup(background=False)  # the background thread started below, not at once
    later = [k for k in eng.specs.keys() if k[0] == "decode" and k[3] == K]
    assert later and set(eng.specs.deferred_keys()) == set(later)
    assert not set(later) & set(eng.programs.compiled) and eng.multistep_pending == len(later)
    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=7)
    prefix = eng.prefill(_prompt(5, 20), sampling)

    def run():
        eng.insert(prefix, 1, sampling)
        out = [eng.generate_many(K).tokens[:, 1] for _ in range(2)]  # 21 + 8: grows to 32
        eng.free(1)
        return np.concatenate(out)

    eng.insert(prefix, 1, sampling)
    single = [int(eng.generate().tokens[1]) for _ in range(2 * K)]
    eng.free(1)
    eng.insert(prefix, 1, sampling)
    assert not eng.multi_step_ready(K)
    eng.free(1)
    programs = len(eng.programs.compiled)
    np.testing.assert_array_equal(run(), single)
    assert len(eng.programs.compiled) == programs, "a stand-in step compiled a program"

    eng.programs.compile_in_background().join()
    assert eng.multistep_pending == 0 and set(later) <= set(eng.programs.compiled)
    eng.insert(prefix, 1, sampling)
    assert eng.multi_step_ready(K)
    eng.free(1)
    np.testing.assert_array_equal(run(), single)
