"""The prefix cache stays consistent under load (worker processes, the router, real clients):
1,000 requests sharing a few prefixes of random lengths, a third of them abandoned by their
client mid-stream, against a byte bound small enough that blocks are evicted all along. Then
the prefill worker's own check() of the cache (every block reachable from its key, the byte
count its blocks', within the bound) holds, as its load report on /metrics says, and every
request that ran to its end produced what the fake engine computes from scratch (a wrong
reuse would also fail loudly inside the fake: its KV is the prompt itself)."""

from __future__ import annotations

import concurrent.futures
import random

import httpx
import pytest

from splitserve.tokenizers import load_tokenizer
from tests.http_stack import http_stack, metric_sum, wait_until
from tests.pipeline_util import expected_fake_tokens

pytestmark = pytest.mark.timeout(600)

REQUESTS = 1000
CONCURRENCY = 16
BLOCK = 4
BOUND_MB = 0.002  # 2,097 bytes: 131 blocks of 4 tokens of the fake's 4-byte KV
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    model = {"prefix_block_tokens": BLOCK, "prefix_cache_mb": BOUND_MB, "num_slots": 16,
             "fake_step_s": 0.002}  # fmt: skip
    with http_stack(tokenizer_512, model=model, router={"max_queued": 64}) as s:
        yield s


def workload(seed: int) -> list[tuple[list[int], bool]]:
    """(prompt ids, abandon it mid-stream) per request: 8 shared prefixes of 1-120 tokens
    (block boundaries among them), each followed by 1-30 tokens of its own."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 500) for _ in range(n)] for n in (1, 4, 8, 23, 40, 64, 97, 120)]
    out = []
    for _ in range(REQUESTS):
        head = rng.choice(prefixes)
        tail = [rng.randrange(3, 500) for _ in range(rng.randint(1, 30))]
        out.append((head + tail, rng.random() < 1 / 3))
    return out


def run_one(url: str, model: str, ids: list[int], abandon: bool) -> str | None:
    """The text of a completed request; None for one its client walked away from."""
    body = {"model": model, "prompt": ids, "max_tokens": 40 if abandon else MAX_TOKENS,
            "ignore_eos": True, "stream": abandon}  # fmt: skip
    with httpx.Client(base_url=url, timeout=60) as client:
        if not abandon:
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # the first token, then the client leaves
        return None


def test_thousand_requests_with_aborts_leave_the_cache_consistent(stack, tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    model = stack.openai().models.list().data[0].id
    work = workload(1)
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        texts = list(pool.map(lambda w: run_one(stack.url, model, *w), work))
    for (ids, abandon), text in zip(work, texts, strict=True):
        if not abandon:
            tokens, _ = expected_fake_tokens(ids, tok.vocab_size, MAX_TOKENS, tok.eos_ids, True)
            assert text == tok.decode(tokens, skip_special_tokens=True), ids

    def settled() -> bool:  # the prefill queue drained and a heartbeat taken after it
        m = stack.metrics()
        return (metric_sum(m, "splitserve_prefill_queue") == 0
                and metric_sum(m, "splitserve_prefills_total") >= REQUESTS * 2 // 3)  # fmt: skip

    wait_until(settled, 60, "the prefill worker to report its prefills")
    m = stack.metrics()
    assert metric_sum(m, "splitserve_prefix_cache_check", index="0") == 1, "check() failed"
    held = metric_sum(m, "splitserve_prefix_cache_bytes", index="0")
    bound = metric_sum(m, "splitserve_prefix_cache_max_bytes", index="0")
    assert bound == int(BOUND_MB * 2**20) and 0 < held <= bound
    assert metric_sum(m, "splitserve_prefix_cache_blocks", index="0") == held // (4 * BLOCK)
    assert metric_sum(m, "splitserve_prefix_cache_evicted_blocks_total", index="0") > 0
    assert metric_sum(m, "vllm:prefix_cache_hits_total") > 0
