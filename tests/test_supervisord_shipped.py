"""The shipped files as shipped: deploy/supervisord.conf with deploy/one-host.toml (the default
model), unmodified, in private network and mount namespaces (its fixed port 8000 and run_dir
/tmp/splitserve are then this test's own). It serves the README's question, and a detok worker
killed mid-stream is restarted while the stream completes on the other one.

Its own module (helpers from tests/test_supervisord.py) so that with pytest-xdist its cold compile
of the default model (minutes in CI, whose cache starts empty) starts at once on a worker of its
own (tests/conftest.py orders it first)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.test_serve_command import pid_alive
from tests.test_supervisord import (
    ROOT,
    Supervisor,
    _freeze_then_kill,
    _wait,
)

pytestmark = pytest.mark.slow

SHIPPED_PORT = 8000  # deploy/one-host.toml's
SHIPPED_RUN_DIR = "/tmp/splitserve"  # deploy/one-host.toml's

NETNS_SHELL = """
set -e
ip link set lo up
mount --bind "$1" /tmp/splitserve
shift
exec "$@"
"""


def _in_namespaces(pid: int, cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """cmd inside the network namespace of process pid (the shipped stack's)."""
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", *cmd],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


ASK = """
import json, urllib.request
body = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 24}
req = urllib.request.Request("http://127.0.0.1:8000/v1/chat/completions",
                             json.dumps(body).encode(), {"Content-Type": "application/json"})
answer = json.loads(urllib.request.urlopen(req, timeout=120).read())
print(answer["choices"][0]["message"]["content"])
"""


@pytest.mark.timeout(1800)  # a cold compile of the default model, beside other tests
def test_the_shipped_supervisord_conf_serves_the_shipped_cluster_file(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("private network and mount namespaces need root (CI runs as root)")
    for tool in ("unshare", "nsenter", "ip"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            pytest.skip(f"{tool} is missing")
    logs = tmp_path / "logs"
    logs.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    os.makedirs(SHIPPED_RUN_DIR, mode=0o700, exist_ok=True)  # the mount point, empty
    env = {**os.environ, "SPLITSERVE_LOGS": str(logs)}
    conf = os.path.join(ROOT, "deploy", "supervisord.conf")  # as shipped: not a copy
    prefix = ["unshare", "--net", "--mount", "--propagation", "private", "--",
              "sh", "-c", NETNS_SHELL, "sh", str(run_dir)]  # fmt: skip
    sup = Supervisor(conf, env, prefix)
    url = f"http://127.0.0.1:{SHIPPED_PORT}"
    client = [sys.executable, os.path.join(ROOT, "tests", "sse_client.py"), "--url", url]
    seen_pids: set[int] = set()
    try:
        health = [sys.executable, "-c", "import urllib.request as u; "
                  f"print(u.urlopen('{url}/health', timeout=5).status)"]  # fmt: skip
        # the default model compiles every shape of one-host.toml first (minutes when cold)
        _wait(lambda: sup.proc.poll() is None
              and _in_namespaces(sup.proc.pid, health, 30).stdout.strip() == "200",
              900, "the shipped stack to serve")  # fmt: skip
        _wait(lambda: set(sup.status().values()) == {"RUNNING"}, 60, "all RUNNING")
        seen_pids |= set(sup.all_pids())
        answer = _in_namespaces(sup.proc.pid, [sys.executable, "-c", ASK], 180)
        assert "Paris" in answer.stdout, (answer.stdout, answer.stderr)
        # a stream, and the detok worker it is pinned to killed in its middle
        reader = subprocess.Popen(
            ["nsenter", f"--net=/proc/{sup.proc.pid}/ns/net", "--", *client, "--progress",
             "--max-tokens", "200", "--timeout", "600"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            for line in reader.stdout:
                if line.startswith("chunk ") and int(line.split()[1]) >= 5:
                    break
            else:
                raise AssertionError("the stream ended before it was mid-way")
            admitted = re.findall(r"(\S+) admitted: \d+ prompt tokens, prefill \d+, decode \d+, "
                                  r"detok (\d+)", (logs / "router.log").read_text())  # fmt: skip
            program = f"detok:detok-{admitted[-1][1]}"
            old = sup.pid(program)
            _freeze_then_kill(old)
            out, _ = reader.communicate(timeout=600)
        finally:
            if reader.poll() is None:
                reader.kill()
        result = json.loads(out.strip().splitlines()[-1])
        assert result["finish_reason"] == "length" and result["tokens"] == 200, result
        _wait(lambda: sup.pid(program) not in (0, old), 60, f"{program} restarted")
        _wait(lambda: set(sup.status().values()) == {"RUNNING"}, 90, "all RUNNING again")
        seen_pids |= set(sup.all_pids())
    finally:
        sup.stop()
    _wait(lambda: not any(pid_alive(p) for p in seen_pids), 30, "every program gone")


