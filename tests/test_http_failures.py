"""A worker dying under running HTTP requests: a streamed request gets an error event and then
[DONE], a non-streamed one gets a 500 naming its request id (the reason is in the router's log),
/health turns 503 naming the dead worker, and service resumes once the worker is back."""

from __future__ import annotations

import concurrent.futures
import re

import httpx
import pytest

from tests.http_stack import assert_error_shape, http_stack, sse_events, wait_healthy

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

INTERNAL = "internal server error: see the server's log for request"


def test_worker_death_surfaces_as_errors_then_service_resumes(tokenizer_512):
    # 400 tokens at 10 ms a step: both requests are still running when decode is killed
    # migration off: the error path (tests/test_migration.py has streams that survive)
    router = {"max_migrations": 0, "queue_timeout_s": 1.0}
    with http_stack(tokenizer_512, model={"fake_step_s": 0.01}, router=router) as stack:
        long = {"prompt": "doomed", "max_tokens": 400, "ignore_eos": True}
        with stack.http() as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
            plain = pool.submit(c.post, "/v1/completions", json=long,
                                headers={"X-Request-Id": "plain"})  # fmt: skip
            with c.stream("POST", "/v1/completions", json={**long, "stream": True},
                          headers={"X-Request-Id": "streamed"}) as r:  # fmt: skip
                events = sse_events(r.iter_lines())
                assert "choices" in next(events)
                stack.stack.kill("decode", 0)
                rest = list(events)
            response = plain.result(timeout=30)

            assert rest[-1] == "[DONE]"
            assert "error" in rest[-2], rest[-2]
            assert rest[-2]["error"]["message"] == f"{INTERNAL} streamed"
            assert all(e["choices"][0]["finish_reason"] is None for e in rest[:-2])

            err = assert_error_shape(response, 500)
            assert err["message"] == f"{INTERNAL} plain"
            with open(f"{stack.logs()}/router-0.log", errors="replace") as fh:
                logged = fh.read().splitlines()
            for rid in ("plain", "streamed"):  # (its core ids start with it)
                assert any(re.search(rf" {rid}\S* finished: error.*decode worker 0 died", line)
                           for line in logged), rid  # fmt: skip

            health = c.get("/health")
            assert health.status_code == 503
            states = {(w["role"], w["index"]): w["state"] for w in health.json()["workers"]}
            assert states[("decode", 0)] == "dead"
            refused = c.post("/v1/completions", json={"prompt": "x"})  # waits, then 503
            err = assert_error_shape(refused, 503)
            assert "being replaced" in err["message"] and refused.headers["Retry-After"] == "5"

        stack.stack.restart("decode", 0)
        wait_healthy(stack.url, 30)
        r = httpx.post(f"{stack.url}/v1/completions", json={"prompt": "again"}, timeout=30)
        assert r.status_code == 200, r.text
