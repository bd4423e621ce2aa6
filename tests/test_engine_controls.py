"""The JAX engine's logits controls (interface.py) against numpy: the raw logits come from the
textbook forward pass (tests/engine_reference.py), the processing from tests/fake_reference.py
(the interface's order, written out by hand). Logprobs are vLLM's processed logprobs:
log_softmax after the mask, bad words, bias and penalties (greedy), and after temperature and
min-p / top-k / top-p too (sampled). A plain request sharing the batch is unaffected, and a
seeded request draws the same tokens whatever shares its batch."""

from __future__ import annotations

import numpy as np
import pytest

from splitserve.engine.interface import LogitsControls, SamplingParams, StepMasks
from splitserve.engine.jax.engine import JaxEngine
from splitserve.engine.model.llama_config import preset
from splitserve.engine.model.weights_random import random_weights
from tests.engine_reference import reference_logits
from tests.fake_reference import Request, process

SLOTS, MAX_SEQ, STEPS = 4, 64, 8
CFG = preset("test-tiny")
WEIGHTS = random_weights(CFG, 9)
LOGPROB_TOL = 2e-3  # float32 engine vs float64 reference, after penalties and scaling


def hf_names(w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The engine's canonical weights ([in, out], stacked) under Hugging Face names."""
    out = {"model.embed_tokens.weight": w["embed"], "model.norm.weight": w["final_norm"]}
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    mats = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
            "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
            "w_down": "mlp.down_proj"}  # fmt: skip
    for i in range(CFG.layers):
        for k, name in names.items():
            out[f"model.layers.{i}.{name}.weight"] = w[k][i]
        for k, name in mats.items():
            out[f"model.layers.{i}.{name}.weight"] = w[k][i].T
    return out


HF = hf_names(WEIGHTS)


def raw_logits(tokens: list[int]) -> np.ndarray:
    """[T, V] float64 logits of every position, by the textbook forward pass."""
    c = CFG
    return reference_logits(HF, tokens, layers=c.layers, heads=c.heads, kv_heads=c.kv_heads,
                            head_dim=c.head_dim, rope_theta=c.rope_theta, rms_eps=c.rms_eps)


def log_softmax(z: np.ndarray) -> np.ndarray:
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


def prompt(seed: int, n: int = 12) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, CFG.vocab_size, n)]


@pytest.fixture(scope="module")
def engine():
    return JaxEngine(CFG, WEIGHTS, SLOTS, MAX_SEQ, prefill_buckets=(16, 64),
                     decode_buckets=(32, 64))  # fmt: skip


def controls_of(req: Request) -> LogitsControls:
    return LogitsControls(
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty, bias_ids=list(req.logit_bias),
        bias_values=list(req.logit_bias.values()), min_p=req.min_p, bad_words=req.bad_words,
        top_logprobs=req.top_logprobs,
    )


def run(engine, prompts, samplings, controls, steps=STEPS, slots=None):
    """Prefill and insert each request (slot i unless given), then `steps` steps.
    Returns per request: [(token, logprob, top ids, top logprobs)] for output positions."""
    slots = slots or list(range(len(prompts)))
    for s in range(SLOTS):
        engine.free(s)
    outs = {s: [] for s in slots}
    for p, sp, c, s in zip(prompts, samplings, controls, slots, strict=True):
        prefix = engine.prefill(p, sp, controls=c) if c else engine.prefill(p, sp)
        top = prefix.first_top
        outs[s].append((prefix.first_token, prefix.first_logprob,
                        None if top is None else top.ids[0], None if top is None else
                        top.logprobs[0]))  # fmt: skip
        if c:
            engine.insert(prefix, s, sp, controls=c)
        else:
            engine.insert(prefix, s, sp)
    for _ in range(steps):
        o = engine.generate()
        for s in slots:
            top = o.top
            outs[s].append((int(o.tokens[s]), float(o.logprobs[s]),
                            None if top is None else top.ids[s],
                            None if top is None else top.logprobs[s]))  # fmt: skip
    return [outs[s] for s in slots]


def check_against_numpy(p: list[int], req: Request, out) -> None:
    """Each output position's token (greedy: the processed argmax; sampled: inside the processed
    support), its logprob and its top logprobs equal numpy on the reference logits."""
    tokens = [t for t, *_ in out]
    logits = raw_logits(p + tokens[:-1])[len(p) - 1 :]
    for i, (token, lp, top_ids, top_lps) in enumerate(out):
        z = process(logits[i], req, p, tokens[:i])
        want = log_softmax(z)
        assert np.isfinite(want[token]), f"position {i}: token {token} was filtered out"
        if req.temperature <= 0:
            assert token == int(np.argmax(want)), f"position {i}"
        np.testing.assert_allclose(lp, want[token], atol=LOGPROB_TOL, err_msg=f"position {i}")
        k = req.top_logprobs
        if k:
            best = np.sort(want)[::-1][:k]
            got = np.asarray(top_lps[:k], np.float64)
            np.testing.assert_allclose(np.maximum(got, -1e4), np.maximum(best, -1e4),
                                       atol=LOGPROB_TOL)  # fmt: skip
            finite = np.isfinite(best)
            np.testing.assert_allclose(want[top_ids[:k][finite]], best[finite], atol=LOGPROB_TOL)


CASES = {
    "top_logprobs": Request(top_logprobs=5),
    "logit_bias": Request(logit_bias={7: 6.0, 100: 4.5, 511: -50.0}, top_logprobs=3),
    "presence_frequency": Request(presence_penalty=1.5, frequency_penalty=0.8, top_logprobs=4),
    "repetition": Request(repetition_penalty=1.9, top_logprobs=2),
    "all": Request(presence_penalty=-0.5, frequency_penalty=0.3, repetition_penalty=1.3,
                   logit_bias={3: 2.0, 40: -1.0}, top_logprobs=20),  # fmt: skip
    "min_p_sampled": Request(temperature=0.7, min_p=0.2, top_logprobs=20),
    "top_k_p_sampled": Request(temperature=1.3, top_k=12, top_p=0.8, presence_penalty=1.0,
                               top_logprobs=20),  # fmt: skip
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_controls_match_numpy(engine, name):
    req = CASES[name]
    sp = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=11)
    p = prompt(1)
    # a plain greedy and a plain sampled request share the batch (slots 0 and 2)
    plain = [SamplingParams(), SamplingParams(temperature=0.9, seed=5)]
    outs = run(engine, [prompt(2), p, prompt(3)], [plain[0], sp, plain[1]],
               [None, controls_of(req), None])  # fmt: skip
    check_against_numpy(p, req, outs[1])
    alone = run(engine, [prompt(2), prompt(3)], plain, [None, None], slots=[0, 2])
    for shared, solo in zip([outs[0], outs[2]], alone, strict=True):
        assert [t for t, *_ in shared] == [t for t, *_ in solo]
        np.testing.assert_allclose([lp for _, lp, *_ in shared], [lp for _, lp, *_ in solo],
                                   atol=1e-5)  # fmt: skip


def test_bad_words_are_never_completed(engine):
    p = prompt(4)
    greedy = [t for t, *_ in run(engine, [p], [SamplingParams()], [None])[0]]
    # ban the first greedy token outright, and the pair the greedy output starts at position 2
    req = Request(bad_words=[[greedy[0]], [greedy[2], greedy[3]]], top_logprobs=3)
    out = run(engine, [p], [SamplingParams()], [controls_of(req)])[0]
    tokens = [t for t, *_ in out]
    assert tokens[0] != greedy[0]
    assert greedy[0] not in tokens
    assert all(tokens[i:i + 2] != [greedy[2], greedy[3]] for i in range(len(tokens) - 1))
    check_against_numpy(p, req, out)


def test_seeded_output_with_penalties_does_not_depend_on_the_batch(engine):
    req = Request(temperature=1.0, presence_penalty=1.2, frequency_penalty=0.4,
                  repetition_penalty=1.1, min_p=0.05)  # fmt: skip
    sp = SamplingParams(temperature=1.0, seed=2024)
    p = prompt(5)
    alone = run(engine, [p], [sp], [controls_of(req)], slots=[1])[0]
    others = [SamplingParams(temperature=0.6, seed=1), SamplingParams(), SamplingParams()]
    busy = run(engine, [prompt(6), p, prompt(7), prompt(8)], [others[0], sp, *others[1:]],
               [None, controls_of(req), controls_of(CASES["all"]), None],
               slots=[0, 3, 1, 2])[1]  # fmt: skip
    assert [t for t, *_ in busy] == [t for t, *_ in alone]
    check_against_numpy(p, req, alone)


def test_a_mask_restricts_every_token(engine):
    """A packed mask allowing a few ids: every token among them, greedy the best of them."""
    allowed = np.zeros(CFG.vocab_size, bool)
    allowed[[5, 77, 300, 301, 450]] = True
    bits = np.packbits(allowed, bitorder="little").view(np.int32)
    p = prompt(9)
    sp = SamplingParams()
    prefix = engine.prefill(p, sp, mask=bits)
    for s in range(SLOTS):
        engine.free(s)
    engine.insert(prefix, 2, sp, controls=LogitsControls(top_logprobs=2))
    tokens = [prefix.first_token]
    for _ in range(4):
        out = engine.generate(masks=StepMasks(np.array([2], np.int32), bits[None]))
        tokens.append(int(out.tokens[2]))
        assert set(out.top.ids[2, :2].tolist()) <= {5, 77, 300, 301, 450}  # as many as asked
    logits = raw_logits(p + tokens[:-1])[len(p) - 1 :]
    for i, t in enumerate(tokens):
        assert t == int(np.argmax(np.where(allowed, logits[i], -np.inf))), f"position {i}"


def test_prompt_logprobs_match_numpy(engine):
    p = prompt(10, 20)
    prefix = engine.prefill(p, SamplingParams(), controls=LogitsControls(prompt_logprobs=4))
    scores = prefix.prompt_logprobs
    logp = np.array([log_softmax(z) for z in raw_logits(p)[:-1]])
    want = logp[np.arange(len(p) - 1), p[1:]]
    np.testing.assert_allclose(scores.logprobs, want, atol=1e-4)
    ranks = 1 + (logp > want[:, None]).sum(axis=1)
    np.testing.assert_array_equal(scores.ranks, ranks)
    np.testing.assert_allclose(scores.top.logprobs, -np.sort(-logp, axis=1)[:, :4], atol=1e-4)
    np.testing.assert_array_equal(scores.top.ids[:, 0], logp.argmax(axis=1))


def test_a_plain_batch_never_runs_the_controls_program(engine):
    """No controls, no mask: the step is today's program (nothing compiled or run for them)."""
    fresh = JaxEngine(CFG, WEIGHTS, SLOTS, MAX_SEQ, prefill_buckets=(16, 64),
                      decode_buckets=(32, 64))  # fmt: skip
    run(fresh, [prompt(2), prompt(3)], [SamplingParams(), SamplingParams(temperature=1.0)],
        [None, None], steps=3)  # fmt: skip
    assert not [k for k in fresh.programs.compiled if k[0] in ("controls", "prompt")]


def test_several_steps_per_call_are_refused_while_a_slot_has_controls(engine):
    run(engine, [prompt(2)], [SamplingParams()], [LogitsControls(presence_penalty=1.0)], steps=0)
    assert engine.controlled
    with pytest.raises(ValueError, match="one step per call"):
        engine.generate_many(1)


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_one_controlled_row_changes_nothing_for_the_plain_rows(mode):
    """The controls program runs on the controlled rows only (gathered, padded to a count
    bucket): the plain rows of the batch get exactly their tokens and logprobs of a batch
    without controls, and the controlled row exactly what it gets alone. One batch size, so
    that alone and busy run the same model pass (its rows do not depend on one another)."""
    engine = JaxEngine(CFG, WEIGHTS, SLOTS, MAX_SEQ, prefill_buckets=(16, 64),
                       decode_buckets=(32, 64), batch_sizes=(SLOTS,))  # fmt: skip
    if mode == "greedy":
        sp = SamplingParams()
        c = LogitsControls(bias_ids=[7, 100], bias_values=[5.0, 3.0], repetition_penalty=1.4,
                           top_logprobs=3)  # fmt: skip
    else:
        sp = SamplingParams(temperature=1.0, seed=77)
        c = LogitsControls(presence_penalty=1.0, min_p=0.05, top_logprobs=4)
    prompts = [prompt(20), prompt(21), prompt(22), prompt(23)]
    plain_sp = [SamplingParams(), sp, SamplingParams(temperature=0.8, seed=5), SamplingParams()]
    busy = run(engine, prompts, plain_sp, [None, c, None, None])
    plain = run(engine, prompts, plain_sp, [None] * SLOTS)
    alone = run(engine, [prompts[1]], [sp], [c], slots=[1])[0]
    for s in (0, 2, 3):
        assert [(t, lp) for t, lp, *_ in busy[s]] == [(t, lp) for t, lp, *_ in plain[s]], s
    assert [(t, lp) for t, lp, *_ in busy[1]] == [(t, lp) for t, lp, *_ in alone]
    for (*_, ids, lps), (*_, want_ids, want_lps) in zip(busy[1], alone, strict=True):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(lps, want_lps)
    assert [t for t, *_ in busy[1]] != [t for t, *_ in plain[1]]  # the controls did act


SAMPLINGS = {"hot": SamplingParams(temperature=0.7, seed=11),
             "filtered": SamplingParams(temperature=1.3, top_k=9, top_p=0.8, seed=2),
             "greedy": SamplingParams()}  # fmt: skip


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_one_logprob_convention_with_and_without_controls(engine, sampling):
    """A request's logprobs do not depend on whether it also asked for alternatives: the plain
    programs (prefill's and decode's sampler) return the processed logprobs the controls
    program does, the same tokens drawn."""
    p = prompt(31)
    plain = run(engine, [p], [sampling], [None])[0]
    asked = run(engine, [p], [sampling], [LogitsControls(top_logprobs=2)])[0]
    assert [t for t, *_ in plain] == [t for t, *_ in asked]
    np.testing.assert_allclose([lp for _, lp, *_ in plain], [lp for _, lp, *_ in asked],
                               atol=1e-4)  # fmt: skip
    for (t, lp, ids, lps) in asked:  # and the token's own logprob is its alternative's
        if t in ids.tolist():
            assert lp == pytest.approx(float(lps[ids.tolist().index(t)]), abs=1e-5)
