"""Logprobs, penalties and logit bias end to end (a real stack, the fake engine, the openai
client), against the reference computed here from the fake engine's documented arithmetic
(tests/fake_reference.py): the sampled tokens, their logprobs and their top-k alternatives; the
prompt's logprobs (echo, prompt_logprobs); bad words; and determinism: a request with
penalties gives the same output whatever else shares the batch."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from splitserve.tokenizers import load_tokenizer
from tests import fake_reference as ref
from tests.http_stack import http_stack

pytestmark = pytest.mark.timeout(300)

N = 12  # output tokens


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(tokenizer_512, model={"num_slots": 8, "fake_step_s": 0.002}) as s:
        yield s


@pytest.fixture(scope="module")
def tok(tokenizer_512):
    return load_tokenizer(tokenizer_512)


def shown(logprob: float) -> float:
    return max(logprob, -9999.0)  # JSON has no -inf: vLLM's floor


def piece(tok, t: int, skip_special: bool = False) -> str:
    """A token's text in logprobs: the sampled ones skip special tokens' text (so that they add
    up to the output), alternatives show it."""
    if skip_special and t in tok.special_ids:
        return ""
    return tok.token_table().pieces[t].decode("utf-8", "replace")


CASES = [
    ref.Request(temperature=0.0, top_logprobs=5),
    ref.Request(temperature=0.7, top_logprobs=3, frequency_penalty=1.5),
    ref.Request(temperature=1.0, presence_penalty=2.0, repetition_penalty=1.4, top_logprobs=2),
    ref.Request(temperature=1.3, min_p=0.1, top_k=20, top_p=0.9, top_logprobs=4),
    ref.Request(temperature=0.0, logit_bias={65: 3.0, 66: -100.0, 200: 1.5}, top_logprobs=1),
    ref.Request(temperature=0.5, frequency_penalty=-0.5, presence_penalty=-1.0, top_logprobs=20),
]


def body_of(req: ref.Request) -> dict:
    body = {"temperature": req.temperature, "top_p": req.top_p, "seed": 3}
    extra = {"ignore_eos": True, "top_k": req.top_k, "min_p": req.min_p,
             "repetition_penalty": req.repetition_penalty}  # fmt: skip
    body["presence_penalty"] = req.presence_penalty
    body["frequency_penalty"] = req.frequency_penalty
    body["logit_bias"] = {str(t): b for t, b in req.logit_bias.items()}
    return {**body, "extra_body": extra}


@pytest.mark.parametrize("req", CASES)
def test_chat_tokens_logprobs_and_alternatives_match_the_reference(client, model, tok, req):
    messages = [{"role": "user", "content": "score these tokens"}]
    prompt = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    want = ref.generate(prompt, tok.vocab_size, req, N)
    out = client.chat.completions.create(
        model=model, messages=messages, max_tokens=N, logprobs=True,
        top_logprobs=req.top_logprobs, **body_of(req),
    )  # fmt: skip
    content = out.choices[0].logprobs.content
    assert [e.token for e in content] == [piece(tok, t, True) for t, _, _ in want]
    assert [e.logprob for e in content] == pytest.approx([lp for _, lp, _ in want], abs=1e-4)
    for entry, (_, _, top) in zip(content, want, strict=True):
        assert [a.token for a in entry.top_logprobs] == [piece(tok, t) for t, _ in top]
        assert [a.logprob for a in entry.top_logprobs] == pytest.approx(
            [shown(lp) for _, lp in top], abs=1e-4
        )


@pytest.mark.parametrize("req", CASES[:3])
def test_completion_alternatives_match_the_reference(client, model, tok, req):
    prompt = tok.encode("alternatives, please")
    want = ref.generate(prompt, tok.vocab_size, req, N)
    out = client.completions.create(model=model, prompt=prompt, max_tokens=N,
                                    logprobs=req.top_logprobs, **body_of(req))  # fmt: skip
    lp = out.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([x for _, x, _ in want], abs=1e-4)
    for alternatives, (t, x, top) in zip(lp.top_logprobs, want, strict=True):
        expected = {piece(tok, t, True): x}
        for a, alp in top:
            expected.setdefault(piece(tok, a), shown(alp))
        assert alternatives == pytest.approx(expected, abs=1e-4)


def test_bad_words_are_never_completed(client, model, tok):
    prompt = tok.encode("no bad words")
    plain = ref.generate(prompt, tok.vocab_size, ref.Request(), N)
    word = tok.decode([plain[3][0]])  # a word the plain output writes
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=N, temperature=0,
        extra_body={"bad_words": [word], "ignore_eos": True},
    )  # fmt: skip
    spellings = (word, " " + word.lstrip())  # alone and after a space, as vLLM tokenizes them
    sequences = [tok.encode(w, add_special_tokens=False) for w in spellings]
    want = ref.generate(prompt, tok.vocab_size, ref.Request(bad_words=[s for s in sequences if s]),
                        N)  # fmt: skip
    assert out.choices[0].text == tok.decode([t for t, _, _ in want])
    assert out.choices[0].text != tok.decode([t for t, _, _ in plain])


def test_echo_scores_the_prompt(client, model, tok):
    text = "evaluate this prompt"
    prompt = tok.encode(text)
    out = client.completions.create(model=model, prompt=text, max_tokens=3, echo=True,
                                    logprobs=2, temperature=0)  # fmt: skip
    choice = out.choices[0]
    assert choice.text.startswith(text)
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == len(prompt) + 3
    for i in range(1, len(prompt)):  # prompt[i] against a prefill of prompt[:i], raw logits
        z = ref.logits((2 * sum(prompt[:i])) % tok.vocab_size, tok.vocab_size)
        logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
        assert lp.token_logprobs[i] == pytest.approx(logp[prompt[i]], abs=1e-4)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=text, max_tokens=3, echo=True, temperature=0, stream=True))
    assert streamed == choice.text


def test_prompt_logprobs_as_vllm_returns_them(stack, tok):
    prompt = tok.encode("prompt scores")
    with stack.http() as c:
        r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                            "prompt_logprobs": 2})  # fmt: skip
    assert r.status_code == 200, r.text
    scores = r.json()["choices"][0]["prompt_logprobs"]
    assert scores[0] is None and len(scores) == len(prompt)
    for i, entry in enumerate(scores[1:], start=1):
        own = entry[str(prompt[i])]
        assert own["rank"] >= 1 and own["decoded_token"] == piece(tok, prompt[i])
        assert len(entry) in (2, 3)  # the prompt's token and its two alternatives (maybe one)


def test_a_penalised_request_is_the_same_whatever_shares_the_batch(client, model, tok):
    req = CASES[1]
    messages = [{"role": "user", "content": "determinism"}]

    def run():
        return client.chat.completions.create(model=model, messages=messages, max_tokens=N,
                                              **body_of(req)).choices[0].message.content

    alone = run()
    neighbours = [
        dict(messages=[{"role": "user", "content": f"noise {i}"}], max_tokens=3 + i * 5,
             frequency_penalty=0.3 * i, logit_bias={str(i): 4.0}, temperature=1.0)
        for i in range(7)
    ]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        noise = [pool.submit(client.chat.completions.create, model=model, **n)
                 for n in neighbours]  # fmt: skip
        together = [pool.submit(run) for _ in range(3)]
        assert [f.result() for f in together] == [alone] * 3
        for f in noise:
            f.result()
