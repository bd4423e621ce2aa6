"""Helpers for the HTTP tests: a whole stack (worker processes and the router process) on a free
port, with the fake engine, ready when /health says 200 with every worker ready, always stopped
afterwards. Starting, waiting and stopping are the launcher's (splitserve.launch)."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from splitserve.config import ClusterConfig
from splitserve.launch.health import every_worker_ready, wait_ready
from splitserve.launch.pipeline import fake_engine_config
from splitserve.launch.ports import free_port
from splitserve.launch.processes import ProcessStack

HTTP_TIMEOUT_S = 30.0
_KEY = re.compile(r'^([^{]+)(?:\{(.*)\})?$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_sum(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of the samples of `name` (as HttpStack.metrics keys them) whose labels include
    `labels`: e.g. metric_sum(m, "vllm:request_success_total", finished_reason="stop")."""
    total = 0.0
    for key, value in samples.items():
        m = _KEY.match(key)
        if m and m.group(1) == name:
            have = dict(_LABEL.findall(m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += value
    return total


@dataclass
class HttpStack:
    config: ClusterConfig
    stack: ProcessStack
    url: str

    @property
    def router(self):
        return self.stack.children[("router", 0)].popen

    def openai(self, api_key: str = "x") -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=api_key, timeout=HTTP_TIMEOUT_S, max_retries=0
        )

    def http(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", HTTP_TIMEOUT_S), **kw)

    def metrics(self, headers: dict[str, str] | None = None) -> dict[str, float]:
        """Every sample of /metrics, keyed 'name{label="value",...}'."""
        r = httpx.get(f"{self.url}/metrics", headers=headers, timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 200, r.text
        out = {}
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def logs(self) -> str:
        return f"{self.config.run_dir}/logs"


@contextlib.contextmanager
def http_stack(tokenizer: str, mode: str = "processes", ready_s: float = 300.0, **sections):
    """mode "processes": each role its own process; "threads": one router process runs all."""
    port = free_port()
    sections["router"] = {"port": port, **sections.get("router", {})}
    config = fake_engine_config(tokenizer, mode, **sections)
    stack = ProcessStack(config, log_dir=f"{config.run_dir}/logs")
    url = f"http://127.0.0.1:{port}"
    try:
        stack.start()
        wait_healthy(url, ready_s, stack)
        yield HttpStack(config, stack, url)
    finally:
        stack.stop(timeout_s=20)


def wait_healthy(url: str, timeout_s: float, stack: ProcessStack | None = None) -> None:
    """/health 200 with every worker ready (tests want every detok worker on the ring); a role
    of `stack` that exits first fails at once."""
    wait_ready(f"{url}/health", timeout_s, every_worker_ready, stack=stack)


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval_s)


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any] | str]:
    """The payloads of an SSE stream: dicts, and the string "[DONE]"."""
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: ") :]
        yield data if data == "[DONE]" else json.loads(data)


def assert_error_shape(response: httpx.Response, status: int, param: str | None = ...) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    if param is not ...:
        assert err["param"] == param, err
    return err
