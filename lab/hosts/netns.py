"""Test hosts on one machine: Linux network namespaces, each with its own address on one bridge,
so that what crosses between them goes through real network stacks (TCP, veth, a bridge). For
tests and benchmarks of several hosts; needs root (`ip` from iproute2, installed if missing).

    with Hosts(["p0", "d0"], "10.213.9") as hosts:   # p0 is 10.213.9.1, d0 10.213.9.2
        hosts.popen("d0", [...]); hosts.run("p0", [...], timeout=30)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

_UP_TIMEOUT_S = 60


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=_UP_TIMEOUT_S)


def ensure_ip() -> None:
    """iproute2's `ip`, installed from Debian's packages when missing."""
    if shutil.which("ip"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, capture_output=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "iproute2"],
                   check=True, capture_output=True, timeout=600, env=env)  # fmt: skip


class Hosts:
    """Namespaces named after `names`, host i at SUBNET.(i+1)/24, all on one bridge (in a
    namespace of its own, so nothing touches the machine's own network)."""

    def __init__(self, names: list[str], subnet: str):
        ensure_ip()
        tag = str(os.getpid() % 100000)
        self.subnet = subnet
        # namespace names are file names, with no 15-byte limit: cutting them (as interface names
        # must be) made prefill-a and prefill-b the same namespace under a 5-digit pid
        self.ns = {name: f"ss{tag}{name}" for name in names}
        self.address = {name: f"{subnet}.{i + 1}" for i, name in enumerate(names)}
        self.switch = f"ss{tag}sw"
        self._made: list[str] = []
        try:
            self._add_ns(self.switch)
            _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i, name in enumerate(names):
                ns, here, there = self.ns[name], f"v{tag}h{i}"[:15], f"v{tag}s{i}"[:15]
                self._add_ns(ns)
                _sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
                _sh("ip", "link", "set", here, "netns", ns)
                _sh("ip", "link", "set", there, "netns", self.switch)
                _sh("ip", "-n", self.switch, "link", "set", there, "master", "br0", "up")
                _sh("ip", "-n", ns, "link", "set", here, "name", "eth0")
                _sh("ip", "-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", "eth0")
                _sh("ip", "-n", ns, "link", "set", "eth0", "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def _add_ns(self, ns: str) -> None:
        _sh("ip", "netns", "add", ns)
        self._made.append(ns)

    def link(self, name: str, up: bool) -> None:
        """Cut (or restore) one host's link to the others."""
        _sh("ip", "-n", self.ns[name], "link", "set", "eth0", "up" if up else "down")

    def command(self, name: str, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[name], *cmd]

    def popen(self, name: str, cmd: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.command(name, cmd), **kw)

    def run(self, name: str, cmd: list[str], timeout: float) -> str:
        return subprocess.run(self.command(name, cmd), capture_output=True, text=True,
                              timeout=timeout).stdout  # fmt: skip

    def leftovers(self, name: str) -> list[str]:
        """Pids still running in a host's namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.ns[name]], capture_output=True,
                             text=True)  # fmt: skip
        return out.stdout.split()

    def close(self) -> None:
        """Kill whatever still runs in the namespaces, and remove them (and so the links)."""
        for ns in self._made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
