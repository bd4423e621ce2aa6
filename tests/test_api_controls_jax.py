"""Logits controls end to end with the real JAX engine (a tiny random Llama in worker processes,
the router, the openai client): what the API returns equals what the engine gives when driven
directly with the same controls (tokens, processed logprobs, alternatives, prompt logprobs), a
json_schema response follows its schema, and a seeded request with penalties writes the same
whatever shares its batch."""

from __future__ import annotations

import concurrent.futures
import json

import jsonschema
import pytest

from splitserve.engine.interface import LogitsControls, SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.tokenizers import load_tokenizer
from tests.http_stack import http_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "random:test-tiny"
SLOTS, MAX_SEQ_LEN, N = 4, 128, 10
ENGINE = {"engine": "jax", "path": MODEL, "num_slots": SLOTS, "max_seq_len": MAX_SEQ_LEN}


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    # warm-up compiles every program under a loaded machine: a generous wait
    with http_stack(tokenizer_512, model=ENGINE, lifecycle={"liveness_timeout_s": 5.0},
                    ready_s=600.0) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def tok(tokenizer_512):
    return load_tokenizer(tokenizer_512)


@pytest.fixture(scope="module")
def direct():
    return build_jax_engine(MODEL, SLOTS, MAX_SEQ_LEN)


def run_direct(engine, prompt, sampling, controls, n):
    """(tokens, logprobs, top logprobs [{id: logprob}]) of the engine driven directly."""
    prefix = engine.prefill(prompt, sampling, controls=controls)
    engine.insert(prefix, 0, sampling, controls=controls)
    k = controls.top_logprobs
    tokens, lps = [prefix.first_token], [prefix.first_logprob]
    tops = [dict(zip(prefix.first_top.ids[0].tolist(), prefix.first_top.logprobs[0].tolist(),
                     strict=True))]  # fmt: skip
    for _ in range(n - 1):
        out = engine.generate()
        tokens.append(int(out.tokens[0]))
        lps.append(float(out.logprobs[0]))
        tops.append(dict(zip(out.top.ids[0, :k].tolist(), out.top.logprobs[0, :k].tolist(),
                             strict=True)))  # fmt: skip
    engine.free(0)
    return tokens, lps, tops


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_penalties_bias_and_alternatives_equal_the_engine_run_directly(client, model, tok,
                                                                       direct, temperature):
    prompt = tok.encode("the order of tokens")
    controls = LogitsControls(presence_penalty=1.0, frequency_penalty=0.5,
                              repetition_penalty=1.2, bias_ids=[65, 200], bias_values=[3.0, 1.5],
                              top_logprobs=3)  # fmt: skip
    want, want_lps, want_tops = run_direct(direct, prompt, SamplingParams(temperature, seed=3),
                                           controls, N)  # fmt: skip
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=N, temperature=temperature, seed=3, logprobs=3,
        presence_penalty=1.0, frequency_penalty=0.5, logit_bias={"65": 3.0, "200": 1.5},
        extra_body={"repetition_penalty": 1.2, "ignore_eos": True},
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.text == tok.decode(want)
    assert choice.logprobs.token_logprobs == pytest.approx(want_lps, abs=1e-4)
    pieces = tok.token_table().pieces
    for got, top in zip(choice.logprobs.top_logprobs, want_tops, strict=True):
        # keyed by text: only alternatives whose text names one token of them are comparable
        # (partial UTF-8 pieces all read as U+FFFD)
        texts = [pieces[t].decode("utf-8", "replace") for t in top]
        expected = {text: max(lp, -9999.0) for text, lp in zip(texts, top.values(), strict=True)
                    if texts.count(text) == 1 and "\ufffd" not in text}  # fmt: skip
        assert set(expected) <= set(got)
        assert [got[k] for k in expected] == pytest.approx(list(expected.values()), abs=1e-4)


def test_echo_scores_the_prompt_as_the_engine_does(client, model, tok, direct):
    prompt = tok.encode("evaluate this prompt, please")
    prefix = direct.prefill(prompt, SamplingParams(), controls=LogitsControls(prompt_logprobs=2))
    out = client.completions.create(model=model, prompt=prompt, max_tokens=1, echo=True,
                                    logprobs=2, temperature=0)  # fmt: skip
    lps = out.choices[0].logprobs.token_logprobs
    assert lps[0] is None  # the first prompt token has no logprob
    want = prefix.prompt_logprobs.logprobs.tolist()
    assert lps[1 : len(prompt)] == pytest.approx(want, abs=1e-4)


def test_a_json_schema_response_follows_the_schema(client, model):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
              "colour": {"enum": ["red", "green"]}}, "required": ["ok", "colour"],
              "additionalProperties": False}  # fmt: skip
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "json please"}], max_tokens=40,
        temperature=0, response_format={"type": "json_schema",
                                        "json_schema": {"name": "x", "schema": schema}},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)


def test_seeded_penalised_output_is_the_same_whatever_shares_the_batch(client, model):
    def ask(text: str, seed: int, **kw) -> str:
        return client.completions.create(
            model=model, prompt=text, max_tokens=N, temperature=1.0, seed=seed,
            extra_body={"ignore_eos": True}, **kw,
        ).choices[0].text  # fmt: skip

    kw = {"presence_penalty": 1.5, "frequency_penalty": 0.5}
    alone = ask("same seed, same words", 99, **kw)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        others = [pool.submit(ask, f"other {i}", i, presence_penalty=0.5 * i) for i in range(3)]
        busy = pool.submit(ask, "same seed, same words", 99, **kw)
        assert busy.result() == alone
        for f in others:
            f.result()
