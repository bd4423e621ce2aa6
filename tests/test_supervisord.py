"""The real supervisord runs splitserve as documented.

1. The shipped files as shipped: tests/test_supervisord_shipped.py (a module of its own, so that
   its minutes of default-model compile start first, beside the rest of the suite).
2. A config the generator writes (`splitserve deploy supervisord`) for a fake-engine cluster file:
   the detok worker a stream is pinned to, then the decode worker, are frozen (SIGSTOP) mid-stream,
   so that the stream cannot end before they die, then SIGKILLed: supervisord restarts each, the
   stream moves and completes with every token, new requests succeed, every program is RUNNING.

Deterministic: each kill lands on a stream that is running and cannot finish without the victim;
the assertions are about outcomes (tokens, finish reasons, pids), not durations."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from splitserve.launch.ports import free_port
from tests.sse_client import stream_completion
from tests.test_serve_command import pid_alive

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


class Supervisor:
    def __init__(self, conf: str, env: dict[str, str], prefix: list[str] = ()):
        """prefix: what runs supervisord (the namespaces of the shipped test)."""
        self.conf = conf
        self.env = env
        self.proc = subprocess.Popen(
            [*prefix, os.path.join(BIN, "supervisord"), "-n", "-c", conf],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def ctl(self, *args: str) -> str:
        out = subprocess.run(
            [os.path.join(BIN, "supervisorctl"), "-c", self.conf, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout

    def status(self) -> dict[str, str]:
        rows = [line.split() for line in self.ctl("status").splitlines() if line.strip()]
        return {r[0]: r[1] for r in rows if len(r) > 1}

    def pid(self, name: str) -> int:
        out = self.ctl("pid", name).strip()
        return int(out) if out.isdigit() else 0

    def all_pids(self) -> list[int]:
        return [int(p) for p in self.ctl("pid", "all").split() if p.isdigit() and int(p) > 0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read() or b"{}") if err.code == 503 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _all_ready(url: str) -> bool:
    health = _health(url)
    return bool(health and health.get("ready")
                and all(w["state"] == "ready" for w in health["workers"]))  # fmt: skip


def _pinned_detok(router_log: str, request_id: str) -> int:
    m = re.search(rf"{re.escape(request_id)}\S* admitted: \d+ prompt tokens, prefill \d+, "
                  r"decode \d+, detok (\d+)", router_log)  # fmt: skip
    assert m, f"{request_id} not admitted in the router's log"
    return int(m.group(1))


class Stream:
    """One streaming request on a thread of this process; `chunks` counts its text chunks."""

    def __init__(self, url: str, max_tokens: int):
        self.request_id = f"sv-{time.monotonic_ns()}"
        self.chunks = 0
        self.mid = threading.Event()
        self.result: dict = {}
        self.thread = threading.Thread(target=self._run, args=(url, max_tokens), daemon=True)
        self.thread.start()

    def _run(self, url: str, max_tokens: int) -> None:
        def on_chunk(n: int) -> None:
            self.chunks = n
            if n >= 10:
                self.mid.set()

        self.result = stream_completion(url, "hello world", max_tokens, self.request_id,
                                        timeout_s=300, on_chunk=on_chunk)  # fmt: skip
        self.mid.set()  # ended, one way or another: the waiter looks at the result


def _freeze_then_kill(pid: int) -> None:
    """SIGSTOP first: from then on the stream cannot end without a new worker; then SIGKILL."""
    os.kill(pid, signal.SIGSTOP)
    os.kill(pid, signal.SIGKILL)


def _generated_conf(tmp_path, tokenizer: str, port: int) -> str:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f"""
[model]
engine = "fake"
tokenizer = "{tokenizer}"
num_slots = 4
max_seq_len = 1024
fake_step_s = 0.02

[cluster]
detok_workers = 2
run_dir = "{tmp_path / 'run'}"

[router]
port = {port}

[lifecycle]
heartbeat_interval_s = 0.2
liveness_timeout_s = 1.5
drain_timeout_s = 5.0
""")
    conf = tmp_path / "supervisord.conf"
    subprocess.run(
        [sys.executable, "-m", "splitserve", "deploy", "supervisord", str(cluster), "-o",
         str(conf), "--python", sys.executable, "--home", ROOT],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(conf)


def test_supervisord_restarts_killed_workers_and_their_streams_complete(tokenizer_512, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    conf = _generated_conf(tmp_path, tokenizer_512, port)
    env = {**os.environ, "SPLITSERVE_LOGS": str(logs)}
    sup = Supervisor(conf, env)
    seen_pids: set[int] = set()
    try:
        _wait(lambda: _all_ready(url), 240, "every worker ready")
        _wait(lambda: set(sup.status().values()) == {"RUNNING"}, 60, "all RUNNING")
        seen_pids |= set(sup.all_pids())
        for victim in ("detok", "decode"):
            stream = Stream(url, 600)  # 12 s at 20 ms a step: it runs while the worker dies
            assert stream.mid.wait(120) and stream.chunks >= 10, stream.result
            if victim == "detok":
                k = _pinned_detok((logs / "router.log").read_text(), stream.request_id)
                program = f"detok:detok-{k}"
            else:
                program = "decode-0"
            old = sup.pid(program)
            _freeze_then_kill(old)
            stream.thread.join(timeout=240)
            # the stream moved off the dead worker and ended with every token
            assert stream.result["finish_reason"] == "length", stream.result
            assert stream.result["tokens"] == 600, stream.result
            _wait(lambda p=program, o=old: sup.pid(p) not in (0, o), 60, f"{program} restarted")
            _wait(lambda: set(sup.status().values()) == {"RUNNING"}, 90, "all RUNNING again")
            _wait(lambda: _all_ready(url), 120, "every worker ready again")
            seen_pids |= set(sup.all_pids())
            after = [stream_completion(url, "after", 20) for _ in range(3)]
            assert all(r["finish_reason"] == "length" and r["tokens"] == 20 for r in after), after
        moved = (logs / "router.log").read_text()
        assert "stream moved to detok" in moved
        # the decode worker's stream moved: as "died" when the router saw it dead first, or as
        # "waited for a live worker" when supervisord had it back before the move was placed
        assert re.search(r"moved \((decode worker 0 died|waited for a live worker)\)", moved)
        assert set(sup.status().values()) == {"RUNNING"}
    finally:
        sup.stop()
    _wait(lambda: not any(pid_alive(p) for p in seen_pids), 30, "every program gone")


# ---- the detok pool as supervisord's numprocs ---------------------------------------------------


def _detoks_ready(url: str, want: set[int]) -> bool:
    health = _health(url) or {}
    ready = {w["index"] for w in health.get("workers", [])
             if w["role"] == "detok" and w["state"] == "ready"}  # fmt: skip
    return ready == want


def _set_detok_numprocs(sup: Supervisor, conf: str, n: int) -> None:
    with open(conf) as fh:
        text = fh.read()
    text = re.sub(r"(\[program:detok\][^\[]*?numprocs=)\d+", rf"\g<1>{n}", text)
    with open(conf, "w") as fh:
        fh.write(text)
    sup.ctl("reread")
    sup.ctl("update")


@pytest.mark.timeout(1200)
def test_supervisord_numprocs_grows_and_shrinks_the_detok_pool(tokenizer_512, tmp_path):
    """numprocs of the detok program 2 -> 4 -> 1 and `supervisorctl update` while streams run:
    the new workers join the ring and take new requests, the streams on restarted or removed
    workers move, and every stream ends with all its tokens."""
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    conf = _generated_conf(tmp_path, tokenizer_512, port)
    sup = Supervisor(conf, {**os.environ, "SPLITSERVE_LOGS": str(logs)})
    try:
        _wait(lambda: _all_ready(url), 240, "every worker ready")
        for n, want in ((4, {0, 1, 2, 3}), (1, {0})):
            streams = [Stream(url, 600) for _ in range(3)]  # 12 s at 20 ms a step at the least
            for s in streams:
                assert s.mid.wait(120) and s.chunks >= 10, s.result
            _set_detok_numprocs(sup, conf, n)  # supervisord restarts the group as n processes
            _wait(lambda w=want: _detoks_ready(url, w), 600, f"detok workers {want} ready")
            for s in streams:
                s.thread.join(timeout=600)
                assert s.result["finish_reason"] == "length", s.result
                assert s.result["tokens"] == 600, s.result
            # new requests spread over the new ring: each worker of the pool takes some
            used: set[int] = set()
            for i in range(200):
                rid = f"pool{n}-{i}"
                r = stream_completion(url, "after", 8, rid)
                assert r["finish_reason"] == "length" and r["tokens"] == 8, r
                used.add(_pinned_detok((logs / "router.log").read_text(), rid))
                if used == want:
                    break
            assert used == want, used
    finally:
        sup.stop()
