"""/metrics under load, read as vLLM's tools read it: every vLLM series with its type and its
labels (`model_name`, the first served name, and `engine`), beside the `splitserve_*` worker
series; cumulative counts typed as counters; /metrics open without the API key when asked.

One real stack (worker processes, the router process, the fake engine) serves the module, with an
API key, --open-metrics and two served names; 16 streams run while /metrics is scraped.
"""

from __future__ import annotations

import concurrent.futures
import os

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.metrics import VLLM_SERIES
from tests.http_stack import http_stack, wait_until

pytestmark = pytest.mark.timeout(180)

KEY = "test-key"
NAMES = ["splitserve-test", "alias-name"]
STREAMS = 16
MAX_TOKENS = 60
STEP_S = 0.01


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(
        tokenizer_512,
        model={"fake_step_s": STEP_S, "num_slots": 8, "decode_steps_max_live": 8},
        router={"api_key": KEY, "open_metrics": True, "served_model_name": NAMES},
    ) as s:
        yield s


def families(url: str) -> dict:
    r = httpx.get(f"{url}/metrics", timeout=10)  # no key: --open-metrics
    assert r.status_code == 200, r.text
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(fams: dict, name: str, suffix: str = "", **labels: str) -> float:
    return sum(
        s.value
        for s in fams[name].samples
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    )


def stream_one(url: str, i: int, model: str) -> None:
    body = {"model": model, "prompt": f"stream {i}", "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                      timeout=60) as r:  # fmt: skip
        assert r.status_code == 200
        for _ in r.iter_lines():
            pass


def test_every_vllm_series_under_load(stack):
    before = families(stack.url)
    seen_running = seen_kv = False
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        # half name the alias: accepted, and counted under the first name
        futures = [pool.submit(stream_one, stack.url, i, NAMES[i % 2]) for i in range(STREAMS)]

        def busy() -> bool:
            nonlocal seen_running, seen_kv
            fams = families(stack.url)
            seen_running |= value(fams, "vllm:num_requests_running") > 0
            seen_kv |= value(fams, "vllm:kv_cache_usage_perc") > 0  # from the heartbeats
            check_types_and_labels(fams)
            return (seen_running and seen_kv) or all(f.done() for f in futures)

        wait_until(busy, 60, "requests running and KV cache in use")
        for f in futures:
            f.result()
    assert seen_running and seen_kv, "the load ended before /metrics showed it"
    after = families(stack.url)
    check_types_and_labels(after)

    def moved(name: str, suffix: str = "", **labels: str) -> float:
        return value(after, name, suffix, **labels) - value(before, name, suffix, **labels)

    model = {"model_name": NAMES[0], "engine": "0"}
    assert moved("vllm:request_success", "_total", finished_reason="length", **model) == STREAMS
    assert moved("vllm:generation_tokens", "_total", **model) == STREAMS * MAX_TOKENS
    assert moved("vllm:prompt_tokens", "_total", **model) > 0
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                 "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                 "vllm:request_params_max_tokens", "vllm:request_max_num_generation_tokens",
                 "vllm:request_time_per_output_token_seconds"):  # fmt: skip
        assert moved(name, "_count", **model) == STREAMS, name
    assert moved("vllm:request_generation_tokens", "_sum", **model) == STREAMS * MAX_TOKENS
    # the last streams' steps ran [model] decode_steps at a time (no prefix waited for a slot);
    # the worker's figures come with its next heartbeats
    wait_until(lambda: value(families(stack.url), "splitserve_decode_chunks", "_total")
               > value(before, "splitserve_decode_chunks", "_total"), 30,
               "dispatches of several decode steps on /metrics")  # fmt: skip
    assert moved("vllm:inter_token_latency_seconds", "_count", **model) > 0
    wait_until(lambda: value(families(stack.url), "vllm:num_requests_running") == 0, 10,
               "no request running")  # fmt: skip


def check_types_and_labels(fams: dict) -> None:
    for name, (kind, extra) in VLLM_SERIES.items():
        assert name in fams, f"{name} missing"
        family = fams[name]
        assert family.type == kind, (name, family.type)
        assert family.samples, name
        for s in family.samples:
            labels = set(s.labels) - {"le"} if kind == "histogram" else set(s.labels)
            assert labels == {"model_name", "engine", *extra}, (s.name, s.labels)
            assert s.labels["model_name"] == NAMES[0] and s.labels["engine"] == "0"
        if kind == "histogram":
            names = {s.name for s in family.samples}
            assert names == {f"{name}_bucket", f"{name}_sum", f"{name}_count"}, names
        if kind == "counter":
            assert {s.name for s in family.samples} == {f"{name}_total"}, name
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error"}
    # cumulative worker counts are counters; levels are gauges
    for name in ("splitserve_dropped_sends", "splitserve_detok_tokens", "splitserve_decode_steps",
                 "splitserve_decode_tokens", "splitserve_kv_sent_bytes",
                 "splitserve_kv_received_bytes", "splitserve_worker_restarts",
                 "splitserve_decode_chunks", "splitserve_prefill_batched_calls",
                 "splitserve_rejected_requests", "splitserve_request_migrations"):  # fmt: skip
        assert fams[name].type == "counter", name
    for name in ("splitserve_worker_up", "splitserve_detok_streams", "splitserve_decode_slots",
                 "splitserve_decode_free_slots", "splitserve_worker_heartbeat_age_seconds"):
        assert fams[name].type == "gauge", name
    for name in ("splitserve_decode_step_gap_seconds", "splitserve_prefill_seconds",
                 "splitserve_decode_insert_seconds"):
        assert fams[name].type == "histogram", name
    roles = {(s.labels["role"], s.labels["index"]) for s in fams["splitserve_worker_up"].samples}
    assert roles == {("prefill", "0"), ("decode", "0"), ("detok", "0"), ("detok", "1")}
    # the request-level series live under vLLM's names only now
    for gone in ("splitserve_requests", "splitserve_time_to_first_token_seconds",
                 "splitserve_prompt_tokens", "splitserve_requests_running"):
        assert gone not in fams, gone
    assert not any(s.name.endswith("_created") for f in fams.values() for s in f.samples)


def test_the_key_still_guards_the_api(stack):
    assert httpx.get(f"{stack.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{stack.url}/health", timeout=10).status_code == 200
    models = stack.openai(api_key=KEY).models.list().data
    assert [m.id for m in models] == NAMES
    out = stack.openai(api_key=KEY).completions.create(model=NAMES[1], prompt="x", max_tokens=2)
    assert out.model == NAMES[0]  # answered under the first name, as vLLM does


def test_one_access_log_line_per_request(stack):
    headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": "access-log-probe"}
    body = {"prompt": "log me", "max_tokens": 3, "ignore_eos": True}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200
    httpx.post(f"{stack.url}/v1/completions", json=body, timeout=30)  # no key: 401
    log_path = os.path.join(stack.logs(), "router-0.log")

    def logged() -> list[str]:
        with open(log_path, errors="replace") as fh:
            return [line for line in fh if "router.access" in line]

    wait_until(lambda: any("id=access-log-probe" in line for line in logged()), 10, "the line")
    (line,) = [ln for ln in logged() if "id=access-log-probe" in ln]
    assert "POST /v1/completions 200 prompt_tokens=" in line
    assert "completion_tokens=3 " in line
    assert any("POST /v1/completions 401" in ln for ln in logged())
    assert not any("GET /health" in ln for ln in logged())  # probes log at debug level only
