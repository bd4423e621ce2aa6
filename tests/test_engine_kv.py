"""JaxEngine's KV cache: decoding after a prefill equals one long prefill, and a slot's
tokens never depend on the other slots, on the slot index, or on who used the slot before."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from splitserve.engine.interface import Prefix, SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.jax.engine import JaxEngine
from splitserve.engine.model import llama_model

SLOTS = 4
MAX_SEQ = 64
BUCKETS = (16, 64)
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=1234)


@pytest.fixture(scope="module")
def engine() -> JaxEngine:
    eng = build_jax_engine(
        "random:test-tiny:7", SLOTS, MAX_SEQ, prefill_buckets=BUCKETS, decode_buckets=BUCKETS
    )
    eng.warmup()
    return eng


@pytest.fixture(autouse=True)
def _free_all(engine):
    yield
    for s in range(SLOTS):
        engine.free(s)


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 512, n)]


def _decode(engine, prefix, slot, sampling, steps):
    """Insert and run `steps` steps; this slot's tokens and logprobs (output positions 1..)."""
    engine.insert(prefix, slot, sampling)
    toks, lps = [], []
    for _ in range(steps):
        out = engine.generate()
        toks.append(int(out.tokens[slot]))
        lps.append(float(out.logprobs[slot]))
    return toks, np.array(lps)


def test_warmup_compiled_every_program(engine):
    keys = engine.specs.keys()
    assert set(keys) <= set(engine.programs.compiled)
    n = len(engine.programs.compiled)
    p = engine.prefill(_prompt(0, 20), SAMPLED)
    _decode(engine, p, 1, SAMPLED, 40)  # crosses capacity 16 -> 64
    assert len(engine.programs.compiled) == n, "a step compiled after warmup"


def test_decode_after_prefill_equals_full_prefill(engine):
    prompt = _prompt(1, 11)
    p = engine.prefill(prompt, GREEDY)
    gen, lps = _decode(engine, p, 2, GREEDY, 40)  # capacity grows 16 -> 64
    seq = prompt + [p.first_token] + gen
    logits = np.asarray(
        jax.jit(llama_model.forward, static_argnums=0)(engine.cfg, engine.params, np.array(seq))
    )
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    logp -= logits.max(-1, keepdims=True)
    n = len(prompt)
    # output position 0 from prefill, 1.. from decode: all are the argmax of the long pass
    assert logits[n - 1].argmax() == p.first_token
    np.testing.assert_allclose(p.first_logprob, logp[n - 1, p.first_token], atol=1e-4)
    for j, tok in enumerate(gen):
        assert logits[n + j].argmax() == tok, f"step {j}"
    np.testing.assert_allclose(lps, logp[np.arange(n, n + 40), gen], atol=1e-4)
    # the engine's own prefill of everything agrees, and its KV extends the short one's
    full = engine.prefill(seq[:-1], GREEDY)
    assert full.first_token == gen[-1]
    for short_kv, long_kv in zip(p.kv, full.kv, strict=True):
        np.testing.assert_allclose(short_kv, long_kv[:, :n], atol=1e-5)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_slot_results_independent_of_batch_and_slot(engine, sampling):
    prompt = _prompt(2, 9)
    p = engine.prefill(prompt, sampling)
    alone_toks, alone_lps = _decode(engine, p, 0, sampling, 24)
    engine.free(0)
    for slot in range(SLOTS):
        # busy neighbours: other prompts, other lengths, other sampling, some started earlier
        others = [s for s in range(SLOTS) if s != slot]
        for i, s in enumerate(others):
            sp = SamplingParams(temperature=0.5 + i, top_k=5 * i, seed=77 + s) if i % 2 else GREEDY
            engine.insert(engine.prefill(_prompt(10 + s, 3 + 9 * i), sp), s, sp)
        for _ in range(slot + 2):
            engine.generate()
        toks, lps = _decode(engine, p, slot, sampling, 24)
        assert toks == alone_toks, f"slot {slot}"
        np.testing.assert_allclose(lps, alone_lps, atol=1e-5)
        for s in range(SLOTS):
            engine.free(s)


def test_reused_slot_forgets_its_previous_sequence(engine):
    short = engine.prefill(_prompt(3, 5), GREEDY)
    want, _ = _decode(engine, short, 0, GREEDY, 10)
    engine.free(0)
    _decode(engine, engine.prefill(_prompt(4, 30), GREEDY), 3, GREEDY, 20)  # a long tenant
    engine.free(3)
    got, _ = _decode(engine, short, 3, GREEDY, 10)
    assert got == want


def test_read_only_prefix_from_a_buffer(engine):
    p = engine.prefill(_prompt(5, 13), SAMPLED)
    want, _ = _decode(engine, p, 1, SAMPLED, 8)
    engine.free(1)
    views = [np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape) for a in p.kv]
    assert not views[0].flags.writeable
    got, _ = _decode(engine, Prefix(views, p.length, p.first_token, p.first_logprob), 2, SAMPLED, 8)
    assert got == want


def test_full_slot_is_clamped_and_harms_no_neighbour(engine):
    neighbour = engine.prefill(_prompt(6, 7), GREEDY)
    want, _ = _decode(engine, neighbour, 1, GREEDY, 12)
    engine.free(1)
    engine.insert(engine.prefill(_prompt(7, MAX_SEQ - 2), GREEDY), 0, GREEDY)
    got, _ = _decode(engine, neighbour, 1, GREEDY, 12)  # slot 0 runs 10 steps past the end
    assert got == want
    assert engine.decode_stepper.table.ints[1, 0] <= MAX_SEQ  # position row: within the cache


def test_bad_requests_are_value_errors(engine):
    with pytest.raises(ValueError):
        engine.prefill([], GREEDY)
    with pytest.raises(ValueError):
        engine.prefill([1] * (MAX_SEQ + 1), GREEDY)
    with pytest.raises(ValueError):
        engine.prefill([512], GREEDY)
    with pytest.raises(ValueError):
        engine.prefill([1, 2], SamplingParams(top_p=0.0))
    p = engine.prefill([1, 2, 3], GREEDY)
    with pytest.raises(ValueError):
        engine.insert(p, SLOTS, GREEDY)
    with pytest.raises(ValueError):
        engine.insert(Prefix([a[:, :2] for a in p.kv], 3, 1, 0.0), 0, GREEDY)


def test_ceiling_measures_the_step_and_prefill(engine):
    from splitserve.bench.ceiling.measure import measure_decode_ceiling, measure_prefill

    decode = measure_decode_ceiling(engine, context_len=20, steps=12, refill_every=5)
    assert decode["step_s"]["p50"] > 0 and decode["tokens_per_s"] > 0
    # the rate is the loop's own: slots over the mean step, as a served rate counts its slow steps
    assert decode["tokens_per_s"] == pytest.approx(SLOTS / decode["step_s"]["mean"])
    assert decode["tokens_per_s_p50"] == pytest.approx(SLOTS / decode["step_s"]["p50"])
    assert not engine.decode_stepper.table.live.any()  # it leaves the engine empty
    prefill = measure_prefill(engine, prompt_len=30, repeats=2)
    assert prefill["prefill_s"]["min"] > 0
    assert "prefill_after_idle_s" not in prefill  # only when asked: it sleeps
    spaced = measure_prefill(engine, prompt_len=30, repeats=3, idle_s=0.001)
    assert spaced["idle_s"] == 0.001
    assert spaced["prefill_after_idle_s"]["min"] > 0 and spaced["prefill_s"]["min"] > 0


def test_cache_grows_at_once_and_shrinks_only_after_a_while():
    """A copy of a big cache stalls a step: the capacity grows when a sequence needs it, but
    shrinks only once the live sequences have needed less for shrink_after_steps steps."""
    eng = build_jax_engine(
        "random:test-tiny:7", 2, MAX_SEQ, prefill_buckets=BUCKETS, decode_buckets=BUCKETS,
        shrink_after_steps=5,
    )  # fmt: skip
    long, short = eng.prefill(_prompt(1, 20), GREEDY), eng.prefill(_prompt(2, 3), GREEDY)
    eng.insert(short, 1, GREEDY)
    eng.generate()
    assert eng.decode_stepper.cache.capacity == 16
    eng.insert(long, 0, GREEDY)
    assert eng.decode_stepper.cache.capacity == 64  # grown for the long prefix at once
    alone = _decode(eng, short, 1, GREEDY, 3)
    eng.free(0)
    for _ in range(4):
        eng.generate()
        assert eng.decode_stepper.cache.capacity == 64  # the short sequence alone needs 16: not yet
    eng.generate()
    assert eng.decode_stepper.cache.capacity == 16
    # whatever the capacity did, the short sequence decodes as it would alone
    eng.free(1)
    again = _decode(eng, short, 1, GREEDY, 3)
    assert again[0] == alone[0]
