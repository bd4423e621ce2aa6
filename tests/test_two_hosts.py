"""Two hosts for real: two Linux network namespaces on one bridge (lab.hosts.netns),
deploy/launch.sh run in each (prefill-host: router + prefill; decode-host: decode + the detok
pool), completions streamed through the router. The KV cache and the tokens cross between the
two network stacks, over CURVE (keys made by `splitserve keys generate`: the file's addresses
are not loopback, so it would not load without them). Then the link is cut mid-stream until the
router sees the decode host's workers die: the requests wait, and when the link comes back every
stream completes with all its tokens. Needs root (CI runs as root); installs iproute2 when `ip`
is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from lab.hosts.netns import Hosts

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBNET = "10.213.7"


def _cluster(tokenizer: str, keys_dir: str) -> str:
    return f"""
[model]
engine = "jax"
path = "random:test-tiny"
tokenizer = "{tokenizer}"
num_slots = 4
max_seq_len = 1024

[router]
host = "{SUBNET}.1"
port = 8000

[lifecycle]
heartbeat_interval_s = 0.2
liveness_timeout_s = 1.5

[security]
keys_dir = "{keys_dir}"

[addresses]
router = "tcp://{SUBNET}.1:5550"
prefill = "tcp://{SUBNET}.1:5551"
decode = "tcp://{SUBNET}.2:5552"
detok = ["tcp://{SUBNET}.2:5560", "tcp://{SUBNET}.2:5561"]

[hosts.prefill-host]
roles = ["router", "prefill"]

[hosts.decode-host]
roles = ["decode", "detok"]
"""


def _generated(hosts: Hosts) -> float:
    """Tokens the router (inside the prefill host's namespace) has delivered, from /metrics."""
    code = (
        "import re, urllib.request as u;"
        f"t = u.urlopen('http://{SUBNET}.1:8000/metrics', timeout=5).read().decode();"
        "m = re.search(r'^vllm:generation_tokens_total\\{[^}]*\\} (\\S+)$', t, re.M);"
        "print(m.group(1) if m else 0)"
    )
    return float(hosts.run("p", [sys.executable, "-c", code], timeout=30).strip() or 0)


def _worker_state(hosts: Hosts, role: str, index: int) -> str:
    """The router's view of one worker, from /health inside the prefill host's namespace."""
    code = (
        "import json, urllib.request as u, urllib.error as e;"
        f"url = 'http://{SUBNET}.1:8000/health'\n"
        "try: body = u.urlopen(url, timeout=5).read()\n"
        "except e.HTTPError as err: body = err.read()\n"
        f"print([w['state'] for w in json.loads(body)['workers'] if (w['role'], w['index']) == "
        f"('{role}', {index})][0])"
    )
    return hosts.run("p", [sys.executable, "-c", code], timeout=30).strip()


def _wait_line(proc: subprocess.Popen, needle: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"launcher exited: {seen[-5:]}")
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"no {needle!r} within {timeout_s}s")


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    with Hosts(["p", "d"], SUBNET) as hosts:  # p at SUBNET.1, d at SUBNET.2, on one bridge
        yield hosts


def test_two_hosts_stream_across_a_real_link(two_hosts, tokenizer_512, tmp_path):
    conf = tmp_path / "two-hosts.toml"
    keys = tmp_path / "keys"
    conf.write_text(_cluster(tokenizer_512, str(keys)))
    subprocess.run([sys.executable, "-m", "splitserve", "keys", "generate", str(keys), "--config",
                    str(conf)], check=True, capture_output=True, timeout=60)  # fmt: skip
    assert sorted(os.listdir(keys)) == sorted(
        f"{name}{suffix}" for name in ("router", "prefill-0", "decode-0", "detok-0", "detok-1")
        for suffix in (".key", ".key_secret")
    )
    env = {**os.environ, "SPLITSERVE_PYTHON": sys.executable}
    launchers = {}
    client = [sys.executable, os.path.join(ROOT, "tests", "sse_client.py")]
    client += ["--url", f"http://{SUBNET}.1:8000"]

    def stream(n: int, max_tokens: int, timeout: float = 120) -> list[dict]:
        out = two_hosts.run("p", [*client, "--requests", str(n), "--max-tokens", str(max_tokens)],
                            timeout)  # fmt: skip
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    try:
        for side, host in (("p", "prefill-host"), ("d", "decode-host")):
            cmd = [os.path.join(ROOT, "deploy", "launch.sh"), host, str(conf)]
            cmd += ["--log-dir", str(tmp_path / host)]
            launchers[side] = two_hosts.popen(
                side, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        for side, host in (("p", "prefill-host"), ("d", "decode-host")):
            _wait_line(launchers[side], f"host {host} ready", 300)

        results = stream(6, 24)
        assert len(results) == 6
        assert all(r["finish_reason"] == "length" and r["tokens"] == 24 for r in results), results

        # cut the link while streams are running: the router sees the decode host's workers die
        # and holds their requests; once the link is back they go on, every token exactly once
        before = _generated(two_hosts)
        load = two_hosts.popen(
            "p", [*client, "--requests", "12", "--max-tokens", "300"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while _generated(two_hosts) < before + 100:  # tokens are crossing the link
            assert time.monotonic() < deadline, "no tokens flowing before the cut"
            time.sleep(0.1)
        two_hosts.link("d", False)
        deadline = time.monotonic() + 60
        while _worker_state(two_hosts, "decode", 0) != "dead":
            assert time.monotonic() < deadline, "the router did not see the decode host go"
            time.sleep(0.2)
        two_hosts.link("d", True)
        out, _ = load.communicate(timeout=300)
        cut = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(cut) == 12
        assert all(r["finish_reason"] == "length" and r["tokens"] == 300 for r in cut), cut
        results = stream(6, 24)
        assert all(r["finish_reason"] == "length" and r["tokens"] == 24 for r in results), results

        # SIGTERM stops each host's processes, leaving nothing running in either namespace
        for proc in launchers.values():
            proc.send_signal(signal.SIGTERM)
        for proc in launchers.values():
            assert proc.wait(timeout=60) == 0
        for name in ("p", "d"):
            assert not two_hosts.leftovers(name), f"processes left on host {name}"
    finally:
        for proc in launchers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in launchers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
