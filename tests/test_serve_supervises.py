"""`splitserve serve` supervises its stack: a worker killed under load is restarted (a clear log
line, a restart count in /metrics) while its streams move and complete, and the detok pool grows
and shrinks while serving (the admin endpoint, behind the API key) without losing a byte."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from splitserve import tomlwrite
from splitserve.launch.ports import free_port
from tests.sse_client import stream_completion

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

API_KEY = "test-client-key"
ADMIN_KEY = "test-admin-key"  # the admin endpoints' own (router/http/admin.py)
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


class Serve:
    """`splitserve serve` with the fake engine, in its own process group; always stopped."""

    def __init__(self, tokenizer: str, tmp_path, *extra: str, sections: dict | None = None):
        """sections: more keys of the cluster file, by section (e.g. {"cluster": {...}})."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "serve.log"
        config = tmp_path / "cluster.toml"
        raw = {
            "model": {"engine": "fake", "fake_step_s": 0.01, "num_slots": 16,
                      "tokenizer": tokenizer},  # fmt: skip
            "lifecycle": {"heartbeat_interval_s": 0.1, "liveness_timeout_s": 1.0},
        }
        for name, values in (sections or {}).items():
            raw.setdefault(name, {}).update(values)
        config.write_text(tomlwrite.dumps(raw))
        cmd = [sys.executable, "-m", "splitserve", "serve", "--config", str(config)]
        cmd += ["--port", str(self.port), "--ready-timeout", "120", *extra]
        env = {**os.environ, "SPLITSERVE_API_KEY": API_KEY, "SPLITSERVE_ADMIN_KEY": ADMIN_KEY}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)  # fmt: skip
        self.http = httpx.Client(base_url=self.url, timeout=30,
                                 headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip

    def health(self) -> dict:
        try:
            return self.http.get("/health").json()
        except (httpx.HTTPError, ValueError):
            return {}

    def wait(self, predicate, what: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert self.proc.poll() is None, f"serve exited: {self.log_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    def worker(self, role: str, index: int) -> dict:
        for w in self.health().get("workers", []):
            if (w["role"], w["index"]) == (role, index):
                return w
        return {}

    def stream(self, n: int, max_tokens: int) -> list[concurrent.futures.Future]:
        pool = concurrent.futures.ThreadPoolExecutor(n)
        futures = [
            pool.submit(stream_completion, self.url, f"prompt {i}", max_tokens, None, 240,
                        {"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
            for i in range(n)
        ]
        pool.shutdown(wait=False)
        return futures

    def close(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _streaming(serve: Serve, futures, tokens: int) -> None:
    """Every stream is running (the server has delivered `tokens` to each, at least)."""
    serve.wait(lambda: _delivered(serve) >= tokens * len(futures), "streams under way")


def _delivered(serve: Serve) -> float:
    text = serve.http.get("/metrics").text
    for line in text.splitlines():  # vLLM's name, with its model_name and engine labels
        if line.startswith("vllm:generation_tokens_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("role", ["decode", "detok"])
def test_serve_restarts_a_killed_worker_and_its_streams_complete(tokenizer_512, tmp_path, role):
    serve = Serve(tokenizer_512, tmp_path)
    try:
        serve.wait(lambda: serve.health().get("status") == "ready", "ready")
        futures = serve.stream(8, 400)  # 4 s of tokens each at 10 ms a step: alive at the kill
        _streaming(serve, futures, 20)
        old = serve.worker(role, 0)["pid"]
        os.kill(old, signal.SIGKILL)
        serve.wait(lambda: serve.worker(role, 0).get("pid") not in (None, old)
                   and serve.worker(role, 0).get("state") == "ready", f"{role} restarted")
        results = [f.result(timeout=240) for f in futures]
        assert all(r["finish_reason"] == "length" and r["tokens"] == 400 for r in results), results
        metrics = serve.http.get("/metrics").text
        assert f'splitserve_worker_restarts_total{{index="0",role="{role}"}} 1.0' in metrics
        assert f"{role}[0] exited with status -9: restarting it (restart 1)" in \
            serve.log_path.read_text()  # fmt: skip
    finally:
        serve.close()


def test_the_detok_pool_grows_and_shrinks_under_load_losing_nothing(tokenizer_512, tmp_path):
    serve = Serve(tokenizer_512, tmp_path)
    try:
        serve.wait(lambda: serve.health().get("status") == "ready", "ready")
        futures = serve.stream(12, 600)
        _streaming(serve, futures, 10)
        for count in (4, 1):
            r = serve.http.post("/admin/detok-workers", json={"count": count}, headers=ADMIN)
            assert r.status_code == 200, r.text

            def settled(count=count):
                pool = serve.http.get("/admin/detok-workers", headers=ADMIN).json()["workers"]
                live = {w["index"] for w in pool if w["live"]}
                loaded = {w["index"] for w in pool if w["streams"]}
                return live == set(range(count)) and loaded <= live

            serve.wait(settled, f"a pool of {count}")
        results = [f.result(timeout=240) for f in futures]
        assert all(r["finish_reason"] == "length" and r["tokens"] == 600 for r in results), results
        moved = [line for line in serve.http.get("/metrics").text.splitlines()
                 if line.startswith('splitserve_request_migrations_total{role="detok"}')]
        assert moved and float(moved[0].split()[1]) > 0, "no stream moved off a removed worker"
        # each stream's text is the fake engine's, whole: the same as an undisturbed request's
        again = stream_completion(serve.url, "prompt 0", 600, None, 120,
                                  {"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
        assert results[0]["text"] == again["text"]
    finally:
        serve.close()


def test_admin_endpoints_need_the_admin_key(tokenizer_512, tmp_path):
    """Not the clients' API key (with it, any client could ask for 256 detok workers)."""
    serve = Serve(tokenizer_512, tmp_path)
    try:
        serve.wait(lambda: serve.health().get("status") == "ready", "ready")
        r = httpx.post(f"{serve.url}/admin/detok-workers", json={"count": 3}, timeout=30)
        assert r.status_code == 401
        r = serve.http.post("/admin/detok-workers", json={"count": 3})  # the API key
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
        r = serve.http.post("/admin/detok-workers", json={"count": 0}, headers=ADMIN)
        assert r.status_code == 400
    finally:
        serve.close()
