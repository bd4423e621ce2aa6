"""Four hosts for real: the shipped deploy/four-hosts.toml (2 prefill hosts, 2 decode hosts, the
router on prefill-a, half the detok pool on each decode host; and again with the whole pool on
one decode host) with the fake engine, each host a Linux network namespace on one bridge
(lab/hosts/netns.py) started with deploy/launch.sh from the one cluster file, every tcp
link over CURVE with keys from `splitserve keys generate`. Many streams, each with its own
prompt, must stream exactly the fake engine's full decode, and every prefill and decode worker
must have served some. Then SIGTERM stops each host, leaving nothing running. Needs root to make
namespaces (CI runs as root); skipped, saying so, where it may not."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from lab.hosts.netns import Hosts
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import expected_fake_tokens
from tests.sse_client import distinct_prompt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "deploy", "four-hosts.toml")
SUBNET = "10.213.21"
# the file's hosts in the order of their addresses (10.0.0.1 .. 10.0.0.4): Hosts gives host i
# the address SUBNET.(i + 1), so the file's addresses only change their subnet
NAMES = ["prefill-a", "prefill-b", "decode-a", "decode-b"]
REQUESTS = 48
MAX_TOKENS = 40


def _netns_permitted() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making network namespaces (ip netns add) needs root; CI runs as root"
    probe = f"ssprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


# the same file with the whole detok pool on decode-a: decode-b's tokens all cross to it
DETOK_ON_ONE_HOST = [
    ('"tcp://10.0.0.4:5560", "tcp://10.0.0.4:5561"]', '"tcp://10.0.0.3:5562", "tcp://10.0.0.3:5563"]'),
    ('roles = ["decode:0", "detok:0-1"]', 'roles = ["decode:0", "detok:0-3"]'),
    ('roles = ["decode:1", "detok:2-3"]', 'roles = ["decode:1"]'),
]


def _cluster(tokenizer: str, layout: list[tuple[str, str]]) -> str:
    """deploy/four-hosts.toml as shipped (with `layout`'s changes), with the fake engine and
    this bridge's subnet."""
    text = open(SHIPPED).read()
    changes = [
        *layout,
        ('engine = "jax"', 'engine = "fake"'),
        ('path = "default"', f'tokenizer = "{tokenizer}"'),
        ("10.0.0.", f"{SUBNET}."),
    ]
    for old, new in changes:
        assert old in text, f"{SHIPPED} no longer has {old!r}: update this test"
        text = text.replace(old, new)
    return text


class Launcher:
    """deploy/launch.sh HOST FILE in the host's namespace; its output read by a thread, so that
    waiting for a line has a deadline even when the launcher prints nothing."""

    def __init__(self, hosts: Hosts, host: str, conf: str, log_dir: str):
        cmd = [os.path.join(ROOT, "deploy", "launch.sh"), host, conf, "--log-dir", log_dir]
        env = {**os.environ, "SPLITSERVE_PYTHON": sys.executable}
        self.host = host
        self.proc = hosts.popen(host, cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"launcher of {self.host} exited: {self.seen[-10:]}")
            self.seen.append(line)
            if needle in line:
                return
        raise AssertionError(f"{self.host}: no {needle!r} within {timeout_s}s: {self.seen[-10:]}")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL past a deadline; the exit status of a clean stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def _metric_by_index(text: str, name: str) -> dict[int, float]:
    """{worker index: value} of one per-worker metric of the router's /metrics."""
    out = {}
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        index = re.search(r'index="(\d+)"', m.group(1))
        if index:
            out[int(index.group(1))] = float(m.group(2))
    return out


@pytest.fixture
def four_hosts():
    why = _netns_permitted()
    if why:
        pytest.skip(why)
    with Hosts(NAMES, SUBNET) as hosts:  # namespaces and what runs in them go, also on failure
        yield hosts


@pytest.mark.parametrize("layout", [[], DETOK_ON_ONE_HOST], ids=["as-shipped", "detok-on-one-host"])
def test_four_hosts_from_one_cluster_file(four_hosts, tokenizer_512, tmp_path, layout):
    conf = tmp_path / "four-hosts.toml"
    conf.write_text(_cluster(tokenizer_512, layout))
    keys = [sys.executable, "-m", "splitserve", "keys", "generate", str(tmp_path / "keys")]
    subprocess.run([*keys, "--config", str(conf)], check=True, capture_output=True, timeout=60)
    launchers = []
    try:
        for host in NAMES:
            launchers.append(Launcher(four_hosts, host, str(conf), str(tmp_path / host)))
        for launcher in launchers:
            launcher.wait_line(f"host {launcher.host} ready", 300)

        # the client runs on another host than the router's: HTTP crosses the bridge too
        client = [sys.executable, os.path.join(ROOT, "tests", "sse_client.py"), "--url",
                  f"http://{SUBNET}.1:8000", "--requests", str(REQUESTS), "--max-tokens",
                  str(MAX_TOKENS), "--distinct", "--timeout", "300"]  # fmt: skip
        out = four_hosts.run("decode-b", client, timeout=400)
        results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(results) == REQUESTS
        tok = load_tokenizer(tokenizer_512)
        for i, r in enumerate(results):
            assert r["prompt"] == distinct_prompt(i)
            tokens, _ = expected_fake_tokens(tok.encode(r["prompt"]), tok.vocab_size, MAX_TOKENS,
                                             ignore_eos=True)  # fmt: skip
            assert (r["finish_reason"], r["error"]) == ("length", None), r
            assert r["tokens"] == MAX_TOKENS
            assert r["text"] == tok.decode(tokens, skip_special_tokens=True), r["request_id"]

        # every prefill and every decode worker served some of them
        fetch = ("import urllib.request as u;"
                 f"print(u.urlopen('http://{SUBNET}.1:8000/metrics', timeout=10).read().decode())")
        metrics = four_hosts.run("prefill-a", [sys.executable, "-c", fetch], timeout=60)
        prefills = _metric_by_index(metrics, "splitserve_prefills_total")
        decoded = _metric_by_index(metrics, "splitserve_decode_tokens_total")
        assert sorted(prefills) == [0, 1] and all(v > 0 for v in prefills.values()), prefills
        assert sorted(decoded) == [0, 1] and all(v > 0 for v in decoded.values()), decoded

        # SIGTERM stops each host's processes, leaving nothing running in its namespace
        for launcher in launchers:
            assert launcher.stop() == 0, launcher.seen[-10:]
        for host in NAMES:
            assert four_hosts.leftovers(host) == [], f"processes left on {host}"
    finally:
        for launcher in launchers:
            launcher.stop()
