"""A worker that stops making progress is replaced (before, a decode worker frozen by SIGSTOP
was never replaced while the router answered 503 "a worker is being replaced"): `splitserve
serve` reads each worker's progress record, SIGKILLs one whose heartbeat thread stopped for
[lifecycle] stuck_timeout_s, and restarts it through its restart path, so a request waiting for
the pipeline completes; a long prefill (the heartbeat thread runs through it) is not stuck
(splitserve/launch/stuck.py, splitserve/progress.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from splitserve.config import LifecycleConfig
from splitserve.launch.processes import Child
from splitserve.launch.stuck import StuckWatch
from splitserve.progress import ProgressRecord, progress_path
from tests.test_serve_command import pid_alive
from tests.test_serve_supervises import Serve

LIFECYCLE = {"stuck_timeout_s": 2.0, "loop_stuck_timeout_s": 30.0}


def ready_pid(serve: Serve, role: str) -> int | None:
    worker = serve.worker(role, 0)
    return worker["pid"] if worker.get("state") == "ready" else None


def started(serve: Serve) -> None:
    serve.wait(lambda: "splitserve: ready on" in serve.log_path.read_text(), "ready")
    serve.wait(lambda: all(ready_pid(serve, r) for r in ("prefill", "decode")), "workers ready")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_stopped_worker_is_killed_and_replaced_and_a_waiting_request_completes(
    tokenizer_512, tmp_path, role
):
    serve = Serve(tokenizer_512, tmp_path, sections={"lifecycle": LIFECYCLE})
    try:
        started(serve)
        frozen = ready_pid(serve, role)
        os.kill(frozen, signal.SIGSTOP)
        serve.wait(lambda: serve.worker(role, 0).get("state") == "dead", "the router to see it")
        # the pipeline lacks a worker now: this request waits for its replacement
        r = serve.http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert ready_pid(serve, role) not in (None, frozen)
        assert not pid_alive(frozen)  # killed, not left stopped beside its replacement
        log = serve.log_path.read_text()
        assert f"{role}[0] (pid {frozen}) makes no progress: its heartbeat thread" in log
        assert f"{role}[0] exited with status -9: restarting it (restart 1)" in log
    finally:
        serve.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stopped_router_is_killed_and_replaced(tokenizer_512, tmp_path):
    """The router's inbox thread keeps its record: frozen, it is replaced as a worker is, and
    its successor serves."""
    serve = Serve(tokenizer_512, tmp_path, sections={"lifecycle": LIFECYCLE})
    try:
        started(serve)
        frozen = router_pid(serve)
        os.kill(frozen, signal.SIGSTOP)
        serve.wait(lambda: router_pid(serve) not in (None, frozen), "a new router", 120)
        serve.wait(lambda: serve.health().get("ready") is True, "the new router ready")
        r = serve.http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert not pid_alive(frozen)
        log = serve.log_path.read_text()
        assert f"router[0] (pid {frozen}) makes no progress: its heartbeat thread" in log
    finally:
        serve.close()


def router_pid(serve: Serve) -> int | None:
    """The router's pid, from the launcher's log of the processes it started (the last one)."""
    found = re.findall(r"started router\[0\] \(pid (\d+)\)", serve.log_path.read_text())
    return int(found[-1]) if found else None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_prefill_longer_than_the_bound_is_not_stuck(tokenizer_512, tmp_path):
    """The fake engine's prefill sleeps 6 s (releasing the GIL, as a device computes): three
    times the bound, while the heartbeat thread beats on."""
    serve = Serve(tokenizer_512, tmp_path, sections={"lifecycle": LIFECYCLE,
                                                     "model": {"fake_prefill_s": 6.0}})  # fmt: skip
    try:
        started(serve)
        pid = ready_pid(serve, "prefill")
        r = serve.http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert ready_pid(serve, "prefill") == pid
        assert "makes no progress" not in serve.log_path.read_text()
    finally:
        serve.close()


def test_the_watch_judges_only_a_worker_s_own_record(tmp_path):
    """By the record's times against the bounds, never by a record of another pid (the
    worker's previous run: a restarted worker warming up is not judged)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = Child("decode", 0, sleeper, None)
        lifecycle = LifecycleConfig(stuck_timeout_s=30.0, loop_stuck_timeout_s=600.0)
        now = [1000.0]
        watch = StuckWatch(str(tmp_path), lifecycle, clock=lambda: now[0])
        assert watch.stuck([child]) == []  # no record yet: warming up
        record = ProgressRecord(progress_path(str(tmp_path), "decode", 0))
        record.pid = sleeper.pid
        record.write(beat_at=990.0, loop_at=500.0)  # a busy loop, a beating heart
        assert watch.stuck([child]) == []
        now[0] = 1100.1  # the loop past its bound
        record.write(beat_at=1095.0, loop_at=500.0)
        assert watch.stuck([child]) == [(child, "its loop has not completed a pass for 600 s")]
        record.write(beat_at=1060.0, loop_at=1100.0)
        (_, why), = watch.stuck([child])
        assert why == "its heartbeat thread has not run for 40 s (stopped?)"
        record.pid = sleeper.pid + 1  # another process's record
        record.write(beat_at=0.0, loop_at=0.0)
        assert watch.stuck([child]) == []
        record.close()
    finally:
        sleeper.kill()
        sleeper.wait()
