"""`splitserve serve` starts the whole local stack, says where it listens, and on Ctrl-C (SIGINT)
or SIGTERM stops every child cleanly: no process of the stack is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from splitserve.launch.ports import free_port


def children_of(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.add(int(entry))
            except OSError:
                pass
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead, just not reaped yet
        return fh.read().split()[2] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_serve_starts_stack_and_stops_every_child(tokenizer_512, sig, mode):
    port = free_port()
    cmd = [sys.executable, "-m", "splitserve", "serve", "--engine", "fake", "--mode", mode]
    cmd += ["--tokenizer", tokenizer_512, "--port", str(port), "--ready-timeout", "120"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"serve exited early: {lines}"
            lines.append(line)
            if "ready on" in line:
                break
        assert f"http://127.0.0.1:{port}" in lines[-1]
        deadline = time.monotonic() + 30
        while True:  # ready means a full pipeline; wait for every worker before counting pids
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                health = json.loads(resp.read())
            if all(w["state"] == "ready" for w in health["workers"]):
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.1)
        pids = {w["pid"] for w in health["workers"]}
        assert len(pids) == (4 if mode == "processes" else 1)
        pids |= children_of(proc.pid)  # the router process too
        assert len(pids) == (5 if mode == "processes" else 1)
        body = json.dumps({"prompt": "hello", "max_tokens": 4}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["usage"]["completion_tokens"] == 4

        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if pid_alive(p)], "orphaned stack processes"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_lets_running_requests_finish(tokenizer_512, tmp_path):
    """A request streaming when the stack gets SIGTERM completes normally, then everything exits."""
    from tests.sse_client import stream_completion

    port = free_port()
    conf = tmp_path / "cluster.toml"
    conf.write_text(
        f'[model]\nengine = "fake"\ntokenizer = "{tokenizer_512}"\nfake_step_s = 0.01\n'
        f"[router]\nport = {port}\n[lifecycle]\ndrain_timeout_s = 20.0\n"
    )
    cmd = [sys.executable, "-m", "splitserve", "serve", "--config", str(conf)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        while "ready on" not in proc.stdout.readline():
            assert time.monotonic() < deadline and proc.poll() is None
        import threading

        result = {}
        t = threading.Thread(
            target=lambda: result.update(stream_completion(f"http://127.0.0.1:{port}", "hi", 300))
        )
        t.start()
        # the request is running (300 tokens at 10 ms a step: seconds to go) when SIGTERM comes
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                if json.loads(resp.read())["running"] == 1:
                    break
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=60)
        assert result["finish_reason"] == "length" and result["tokens"] == 300, result
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_launcher_pins_roles_to_their_cpus(tokenizer_512):
    """[hosts.<name>.cpus] (ProcessStack cpus=...) pins a role's process to its CPUs."""
    from splitserve.launch.processes import ProcessStack
    from tests.pipeline_util import make_config

    config = make_config(tokenizer_512)
    cpu = sorted(os.sched_getaffinity(0))[0]
    stack = ProcessStack(config, roles=("detok",), cpus={"detok": [cpu]})
    try:
        stack.start()
        pids = stack.pids()
        deadline = time.monotonic() + 30
        while any(os.sched_getaffinity(p) != {cpu} for p in pids):
            assert time.monotonic() < deadline, "detok workers were not pinned"
            assert not stack.dead(), "a detok worker exited"
            time.sleep(0.1)
    finally:
        stack.stop(timeout_s=10)


def io_thread_cpus(pid: int) -> list[set[int]]:
    """The CPU sets of a process's ZeroMQ I/O threads (libzmq names them ZMQbg/IO/<n>)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as fh:
            if fh.read().startswith("ZMQbg/IO"):
                out.append(os.sched_getaffinity(int(tid)))
    return out


def test_serve_pins_role_processes_to_cluster_cpus(tokenizer_512, tmp_path):
    """[cluster.cpus] in the file given to `splitserve serve` pins each role's processes, and
    `io` the ZeroMQ I/O threads of the workers (here: off the decode worker's CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    decode_cpu, other_cpu = cpus[0], cpus[-1]
    port = free_port()
    conf = tmp_path / "pinned.toml"
    conf.write_text(
        f'[model]\nengine = "fake"\ntokenizer = "{tokenizer_512}"\n'
        f'[cluster]\nmode = "processes"\nrun_dir = "{tmp_path}"\n'
        f"[cluster.cpus]\ndecode = [{decode_cpu}]\nprefill = [{other_cpu}]\n"
        f"detok = [{other_cpu}]\nrouter = [{other_cpu}]\nio = [{other_cpu}]\n"
        f'[router]\nhost = "127.0.0.1"\nport = {port}\n'
    )
    cmd = [sys.executable, "-m", "splitserve", "serve", "--config", str(conf)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        want = {"decode_worker": {decode_cpu}}
        deadline = time.monotonic() + 60
        while True:
            found, io = {}, {}
            for pid in children_of(proc.pid):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        argv = fh.read().split(b"\0")
                    module = argv[argv.index(b"-m") + 1].decode()
                    found[module] = os.sched_getaffinity(pid)
                    io[module] = io_thread_cpus(pid)
                except (OSError, ValueError, IndexError):
                    continue
            expected = {m: want.get(m, {other_cpu}) for m in
                        ("prefill_worker", "decode_worker", "detok_worker", "router")}
            if all(found.get(m) == cs for m, cs in expected.items()) and io["decode_worker"]:
                assert all(cpus == {other_cpu} for cpus in io["decode_worker"]), io
                break
            assert proc.poll() is None, "serve exited"
            assert time.monotonic() < deadline, f"roles not pinned as configured: {found}"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
