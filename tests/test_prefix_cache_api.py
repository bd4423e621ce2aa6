"""The prefix cache seen from outside, end to end (worker processes, the router, the openai client):
usage.prompt_tokens_details.cached_tokens in completions, chat and responses, vLLM's
prefix-cache counters and the per-worker figures on /metrics, and a stack with the cache off
that gives the same text and reports nothing cached."""

from __future__ import annotations

import numpy as np
import pytest

from splitserve.tokenizers import load_tokenizer
from tests.http_stack import http_stack, metric_sum, wait_until
from tests.pipeline_util import expected_fake_tokens

pytestmark = pytest.mark.timeout(180)

BLOCK = 4


@pytest.fixture(scope="module")
def tok(tokenizer_512):
    return load_tokenizer(tokenizer_512)


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(tokenizer_512, model={"prefix_block_tokens": BLOCK}) as s:
        yield s


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def complete(stack, ids: list[int], max_tokens: int = 6):
    client = stack.openai()
    model = client.models.list().data[0].id
    return client.completions.create(model=model, prompt=ids, max_tokens=max_tokens,
                                     extra_body={"ignore_eos": True})  # fmt: skip


def test_completions_report_cached_tokens(stack, tok):
    shared = prompt(0, 41)
    first = complete(stack, shared + [7, 8])
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = complete(stack, shared + [7, 8])
    assert again.usage.prompt_tokens_details.cached_tokens == 40  # 43 tokens: 10 whole blocks
    other = complete(stack, shared[:21] + [9])  # shares 5 whole blocks, then differs
    assert other.usage.prompt_tokens_details.cached_tokens == 20
    for ids, out in ((shared + [7, 8], again), (shared[:21] + [9], other)):
        tokens, _ = expected_fake_tokens(ids, tok.vocab_size, 6, tok.eos_ids, True)
        assert out.choices[0].text == tok.decode(tokens, skip_special_tokens=True)


def test_chat_and_responses_report_cached_tokens(stack):
    client = stack.openai()
    model = client.models.list().data[0].id
    system = "You are a careful assistant. " * 8
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=5)
    again = client.chat.completions.create(model=model, messages=messages, max_tokens=5)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert BLOCK <= cached < again.usage.prompt_tokens and cached % BLOCK == 0
    assert again.choices[0].message.content == first.choices[0].message.content
    client.responses.create(model=model, instructions=system, input="hi", max_output_tokens=5)
    reply = client.responses.create(model=model, instructions=system, input="hi",
                                    max_output_tokens=5)  # fmt: skip
    assert reply.usage.input_tokens_details.cached_tokens >= BLOCK


def test_metrics_count_queries_and_hits(stack):
    before = stack.metrics()
    ids = prompt(5, 30)
    complete(stack, ids)
    complete(stack, ids)  # 28 of its 30 tokens hit

    def counted() -> bool:
        m = stack.metrics()
        grown = metric_sum(m, "vllm:prefix_cache_queries_total") - metric_sum(
            before, "vllm:prefix_cache_queries_total")
        return grown >= 60 and metric_sum(m, "vllm:prefix_cache_hits_total") - metric_sum(
            before, "vllm:prefix_cache_hits_total") >= 28

    wait_until(counted, 20, "the prefill worker's heartbeat with the new counts")
    m = stack.metrics()
    hits = metric_sum(m, "vllm:prefix_cache_hits_total")
    assert hits == metric_sum(m, "splitserve_prefix_cache_hits_total", index="0")
    assert metric_sum(m, "vllm:prefix_cache_queries_total") >= hits
    assert metric_sum(m, "splitserve_prefix_cache_blocks", index="0") >= 7
    assert metric_sum(m, "splitserve_prefix_cache_check", index="0") == 1
    assert 0 < metric_sum(m, "splitserve_prefix_cache_bytes") <= metric_sum(
        m, "splitserve_prefix_cache_max_bytes")


def test_cache_off_gives_the_same_text_and_no_hits(tokenizer_512, stack):
    ids = prompt(9, 50)
    complete(stack, ids)
    cached = complete(stack, ids)
    assert cached.usage.prompt_tokens_details.cached_tokens == 48
    with http_stack(tokenizer_512, model={"prefix_cache": False}) as off:
        complete(off, ids)
        plain = complete(off, ids)
        assert plain.usage.prompt_tokens_details.cached_tokens == 0
        assert plain.choices[0].text == cached.choices[0].text
        wait_until(lambda: "splitserve_prefix_cache_check" in str(off.metrics()), 20,
                   "a prefill heartbeat")  # fmt: skip
        m = off.metrics()
        assert not any(k.startswith("vllm:prefix_cache") for k in m), "a cache that is off"
        assert metric_sum(m, "splitserve_prefix_cache_check", index="0") == -1


def test_prompt_logprobs_are_computed_from_scratch(stack):
    ids = prompt(11, 26)
    complete(stack, ids)
    client = stack.openai()
    model = client.models.list().data[0].id
    out = client.completions.create(model=model, prompt=ids, max_tokens=2,
                                    extra_body={"prompt_logprobs": 1})  # fmt: skip
    assert out.usage.prompt_tokens_details.cached_tokens == 0  # every position was scored
    assert len(out.choices[0].prompt_logprobs) == len(ids)
