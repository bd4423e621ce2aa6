"""The fake engine's logits controls against the reference written from its docstring
(tests/fake_reference.py): penalties, logit bias, min-p, bad words, temperature, top-k/top-p,
grammar masks, top logprobs and prompt logprobs; each slot's output is what it would be alone,
whatever shares the batch; a batch without controls takes the plain path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.engine.fake.engine import FakeEngine, fake_logprob
from splitserve.engine.interface import LogitsControls, SamplingParams, StepMasks
from tests import fake_reference as ref

V = 97  # small and prime: every id is reachable, and the arithmetic stays readable


def controls_of(req: ref.Request) -> LogitsControls:
    return LogitsControls(
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        bias_ids=list(req.logit_bias),
        bias_values=list(req.logit_bias.values()),
        min_p=req.min_p,
        bad_words=req.bad_words,
        top_logprobs=req.top_logprobs,
    )


def sampling_of(req: ref.Request) -> SamplingParams:
    return SamplingParams(req.temperature, req.top_p, req.top_k, seed=7)


def run_engine(engine, slot, prompt, req, steps, masks_for=None):
    """Prefill + insert into `slot` + steps; the other slots keep whatever they hold."""
    mask = masks_for([]) if masks_for else None
    prefix = engine.prefill(prompt, sampling_of(req), controls=controls_of(req), mask=_pack(mask))
    engine.insert(prefix, slot, sampling_of(req), controls=controls_of(req))
    out = [(prefix.first_token, prefix.first_logprob,
            _pairs(prefix.first_top.ids[0], prefix.first_top.logprobs[0])
            if prefix.first_top is not None else [])]  # fmt: skip
    tokens = [prefix.first_token]
    for _ in range(steps - 1):
        masks = None
        if masks_for is not None:
            masks = StepMasks(np.array([slot], np.int32), _pack(masks_for(tokens))[None])
        step = engine.generate(masks=masks)
        top = (_pairs(step.top.ids[slot, : req.top_logprobs],
                      step.top.logprobs[slot, : req.top_logprobs])
               if step.top is not None else [])  # fmt: skip
        out.append((int(step.tokens[slot]), float(step.logprobs[slot]), top))
        tokens.append(int(step.tokens[slot]))
    return out


def _pack(allowed):
    if allowed is None:
        return None
    words = (allowed.size + 31) // 32
    padded = np.zeros(words * 32, bool)
    padded[: allowed.size] = allowed
    return np.packbits(padded, bitorder="little").view(np.int32)


def _pairs(ids, lps):
    return [(int(i), float(lp)) for i, lp in zip(ids, lps, strict=True)]


def assert_same(got, want):
    assert [t for t, _, _ in got] == [t for t, _, _ in want]
    assert [lp for _, lp, _ in got] == pytest.approx([lp for _, lp, _ in want], abs=1e-4)
    for (_, _, g), (_, _, w) in zip(got, want, strict=True):
        assert [t for t, _ in g] == [t for t, _ in w]
        assert [lp for _, lp in g] == pytest.approx([lp for _, lp in w], abs=1e-4)


requests = st.builds(
    ref.Request,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.sampled_from([0, 1, 5]),
    top_p=st.sampled_from([1.0, 0.9, 0.3]),
    min_p=st.sampled_from([0.0, 0.05, 0.5]),
    presence_penalty=st.sampled_from([0.0, 0.7, -1.0, 2.0]),
    frequency_penalty=st.sampled_from([0.0, 0.4, 2.0]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.8]),
    logit_bias=st.dictionaries(st.integers(0, V - 1), st.sampled_from([-100.0, -3.0, 5.0, 100.0]),
                               max_size=3),  # fmt: skip
    bad_words=st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=2), max_size=3),
    top_logprobs=st.sampled_from([0, 1, 4]),
)


@settings(max_examples=60, deadline=None)
@given(req=requests, prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=6),
       other=requests, slot=st.integers(0, 2))  # fmt: skip
def test_controls_match_the_documented_arithmetic_whatever_shares_the_batch(
    req, prompt, other, slot
):
    engine = FakeEngine(3, 256, V)
    # a neighbour with controls of its own in another slot changes nothing for this one
    run_engine(engine, (slot + 1) % 3, [5, 6], other, 1)
    got = run_engine(engine, slot, prompt, req, 12)
    assert_same(got, ref.generate(prompt, V, req, 12))


def test_penalties_change_the_choice_as_documented():
    """By hand: with frequency_penalty 1 a token the output holds loses a full point of logit."""
    prompt = [3]
    penalised = ref.generate(prompt, V, ref.Request(frequency_penalty=5.0), 6)
    engine = FakeEngine(1, 256, V)
    assert_same(run_engine(engine, 0, prompt, ref.Request(frequency_penalty=5.0), 6), penalised)
    tokens = [t for t, _, _ in penalised]
    assert len(set(tokens)) == len(tokens)  # a heavy penalty: no token twice
    # by hand: the first token is the prefill's choice (nothing to penalise yet), 2 * 3
    assert tokens[0] == 6


def test_logit_bias_of_100_forces_a_token():
    engine = FakeEngine(1, 256, V)
    got = run_engine(engine, 0, [1, 2], ref.Request(logit_bias={42: 100.0}), 5)
    assert [t for t, _, _ in got] == [42] * 5


def test_a_mask_constrains_every_token_including_the_first():
    allowed = np.zeros(V, bool)
    allowed[[10, 20, 30]] = True
    engine = FakeEngine(2, 256, V)
    got = run_engine(engine, 1, [4, 4], ref.Request(), 8, masks_for=lambda _: allowed)
    assert {t for t, _, _ in got} <= {10, 20, 30}
    assert_same(got, ref.generate([4, 4], V, ref.Request(), 8, masks=lambda _: allowed))


def test_a_batch_without_controls_keeps_the_plain_formula():
    engine = FakeEngine(2, 256, V)
    prefix = engine.prefill([7], SamplingParams())
    assert prefix.first_token == 14 and prefix.first_top is None
    assert prefix.first_logprob == pytest.approx(fake_logprob(14, V))
    engine.insert(prefix, 0, SamplingParams())
    step = engine.generate()
    assert step.top is None and step.tokens[0] == (4 * 14 + 1) % V


def test_prompt_logprobs_score_each_token_against_a_prefill_of_what_precedes_it():
    prompt = [3, 9, 1, 50]
    prefix = FakeEngine(1, 256, V).prefill(prompt, SamplingParams(),
                                           controls=LogitsControls(prompt_logprobs=3))
    scores = prefix.prompt_logprobs
    for i in range(1, len(prompt)):
        c = (2 * sum(prompt[:i])) % V
        z = ref.logits(c, V)
        logp = z - np.log(np.exp(z - z.max()).sum()) - z.max()
        assert scores.logprobs[i - 1] == pytest.approx(logp[prompt[i]], abs=1e-4)
        assert scores.ranks[i - 1] == 1 + int((logp > logp[prompt[i]]).sum())
        _, _, top = ref.pick(z, c, 3)
        assert scores.top.ids[i - 1].tolist() == [t for t, _ in top]
