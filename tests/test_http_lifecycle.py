"""The router process's life: threads mode (one process runs every role), the API key, and SIGTERM
draining running requests before the process exits."""

from __future__ import annotations

import signal
import time

import httpx
import openai
import pytest

from splitserve.tokenizers import load_tokenizer
from tests.http_stack import assert_error_shape, http_stack, sse_events, wait_until
from tests.pipeline_util import expected_fake_tokens

pytestmark = pytest.mark.timeout(120)

KEY = "sekrit-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(
        tokenizer_512,
        mode="threads",
        model={"fake_step_s": 0.01},
        router={"api_key": KEY},
        lifecycle={"drain_timeout_s": 10.0},
    ) as s:
        yield s


def test_threads_mode_runs_every_role_in_the_router_process(stack, tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    assert list(stack.stack.children) == [("router", 0)]
    health = httpx.get(f"{stack.url}/health", timeout=10).json()
    assert {(w["role"], w["state"]) for w in health["workers"]} == {
        ("prefill", "ready"), ("decode", "ready"), ("detok", "ready"),
    }  # fmt: skip
    assert {w["pid"] for w in health["workers"]} == {stack.router.pid}
    out = stack.openai(KEY).completions.create(
        model="SmolLM2-135M-Instruct.Q4_1.gguf", prompt="one process", max_tokens=10,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    tokens, _ = expected_fake_tokens(tok.encode("one process"), tok.vocab_size, 10)
    assert out.choices[0].text == tok.decode(tokens)


def test_api_key_is_required_except_for_health(stack):
    with stack.http() as c:
        for path, method in (
            ("/v1/completions", "POST"), ("/v1/chat/completions", "POST"), ("/generate", "POST"),
            ("/v1/models", "GET"), ("/metrics", "GET"),
        ):  # fmt: skip
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                r = c.request(method, path, json={"prompt": "x"}, headers=headers)
                err = assert_error_shape(r, 401)
                assert err["code"] == "invalid_api_key"
        assert c.get("/health").status_code == 200
        assert c.get("/metrics", headers=AUTH).status_code == 200
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=AUTH)
        assert r.status_code == 200, r.text
    with pytest.raises(openai.AuthenticationError):
        stack.openai("wrong").models.list()
    assert stack.openai(KEY).models.list().data


def test_sigterm_drains_running_requests_then_exits(stack):
    """Last in this module: it stops the stack's router."""
    payload = {"prompt": "finish me", "max_tokens": 150, "ignore_eos": True, "stream": True}
    with stack.http(headers=AUTH) as c:
        with c.stream("POST", "/v1/completions", json=payload) as r:
            events = sse_events(r.iter_lines())
            first = next(events)
            stack.router.send_signal(signal.SIGTERM)
            # draining: no new work is admitted, and /health says so
            wait_until(lambda: c.get("/health").status_code == 503, 5, "/health 503")
            refused = c.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
            assert_error_shape(refused, 503)
            rest = list(events)
        assert rest[-1] == "[DONE]"
        chunks = [first, *rest[:-1]]
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
        assert all("error" not in c for c in chunks)
    deadline = time.monotonic() + 15
    while stack.router.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stack.router.returncode == 0
