"""Starting and stopping a stack of roles: as OS processes (the default) or as threads.

ProcessStack spawns `python -m <role> --config FILE --index K` per role, each child in its own
session (so that a terminal's Ctrl-C reaches only the launcher, which then stops the children in
order); each child asks for a parent-death signal itself (procutil), so that none outlives a
launcher that was killed.
ThreadStack runs the same worker classes as threads over inproc sockets in this process.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import zmq

from splitserve import tomlwrite
from splitserve.config import ClusterConfig, config_to_dict
from splitserve.procutil import CPUS_ENV, IO_CPUS_ENV, PARENT_ENV

log = logging.getLogger(__name__)

ROLE_MODULES = {
    "router": "router",
    "prefill": "prefill_worker",
    "decode": "decode_worker",
    "detok": "detok_worker",
}
WORKER_ROLES = ("prefill", "decode", "detok")


def write_config(config: ClusterConfig, path: str | None = None) -> str:
    path = path or os.path.join(
        config.run_dir or tempfile.mkdtemp(prefix="splitserve-"), "cluster.toml"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(tomlwrite.dumps(config_to_dict(config)))
    return path


def role_instances(config: ClusterConfig, roles: Iterable[str]) -> list[tuple[str, int]]:
    out = []
    for role in roles:
        count = config.detok_count if role == "detok" else 1
        out.extend((role, i) for i in range(count))
    return out


@dataclass
class Child:
    role: str
    index: int
    popen: subprocess.Popen
    log_path: str | None

    @property
    def name(self) -> str:
        return f"{self.role}[{self.index}]"


class ProcessStack:
    """Roles as OS processes. Use as a context manager; stop() is safe to call twice."""

    def __init__(
        self,
        config: ClusterConfig,
        roles: Iterable[str] = ("prefill", "decode", "detok", "router"),
        env: dict[str, str] | None = None,
        log_dir: str | None = None,
        cpus: dict[str, list[int]] | None = None,
        config_path: str | None = None,
    ):
        self.config = config
        self.roles = tuple(roles)
        self.env = dict(os.environ if env is None else env)
        self.log_dir = log_dir
        self.cpus = cpus or {}
        self.config_path = config_path or write_config(config)
        self.children: dict[tuple[str, int], Child] = {}

    def start(self) -> ProcessStack:
        for role, index in role_instances(self.config, self.roles):
            self.spawn(role, index)
        return self

    def spawn(self, role: str, index: int) -> Child:
        cmd = [sys.executable, "-m", ROLE_MODULES[role], "--config", self.config_path]
        cmd += ["--index", str(index)]
        log_path = None
        out = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            log_path = os.path.join(self.log_dir, f"{role}-{index}.log")
            out = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        env = {**self.env, PARENT_ENV: str(os.getpid())}
        if self.cpus.get(role):
            env[CPUS_ENV] = ",".join(str(c) for c in self.cpus[role])
        if self.cpus.get("io"):  # the zmq I/O threads of every worker role
            env[IO_CPUS_ENV] = ",".join(str(c) for c in self.cpus["io"])
        popen = subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only
        )
        if out:
            out.close()
        child = Child(role, index, popen, log_path)
        self.children[(role, index)] = child
        log.info("started %s (pid %d)", child.name, popen.pid)
        return child

    def kill(self, role: str, index: int = 0, sig: int = signal.SIGKILL) -> None:
        child = self.children[(role, index)]
        child.popen.send_signal(sig)
        child.popen.wait(timeout=30)

    def restart(self, role: str, index: int = 0) -> Child:
        old = self.children.get((role, index))
        if old and old.popen.poll() is None:
            self.kill(role, index)
        return self.spawn(role, index)

    def dead(self) -> list[Child]:
        return [c for c in self.children.values() if c.popen.poll() is not None]

    def pids(self) -> list[int]:
        return [c.popen.pid for c in self.children.values()]

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the router first (it drains), then the workers; SIGKILL what is left."""
        order = sorted(self.children.values(), key=lambda c: c.role != "router")
        deadline = time.monotonic() + timeout_s
        for group in (
            [c for c in order if c.role == "router"],
            [c for c in order if c.role != "router"],
        ):
            for c in group:
                if c.popen.poll() is None:
                    c.popen.send_signal(signal.SIGTERM)
            for c in group:
                try:
                    c.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in time: killing it", c.name)
                    c.popen.kill()
                    c.popen.wait()

    def __enter__(self) -> ProcessStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ThreadStack:
    """The worker roles as threads in this process, over inproc sockets of one shared context.

    The router core runs on the caller's event loop with the same context (RouterCore(ctx=...)).
    """

    def __init__(self, config: ClusterConfig, environ: dict[str, str] | None = None):
        from decode_worker.worker import DecodeWorker
        from detok_worker.worker import DetokWorker
        from prefill_worker.worker import PrefillWorker

        self.config = config
        self.environ = dict(os.environ if environ is None else environ)
        self.ctx = zmq.Context()
        self.stop_event = threading.Event()
        self.classes = {"prefill": PrefillWorker, "decode": DecodeWorker, "detok": DetokWorker}
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self) -> ThreadStack:
        # receivers bind in the constructors, before any thread connects to them
        workers = [
            self.classes[role](self.config, index, self.ctx, self.stop_event, self.environ)
            for role, index in role_instances(self.config, WORKER_ROLES)
        ]
        for w in workers:
            t = threading.Thread(
                target=self._run, args=(w,), name=f"{w.role}-{w.index}", daemon=True
            )
            t.start()
            self.threads.append(t)
        return self

    def _run(self, worker) -> None:
        try:
            worker.run()
        except BaseException as exc:  # recorded and logged; the stack's owner decides
            log.exception("%s[%d] thread failed", worker.role, worker.index)
            self.errors.append(exc)

    def stop(self, timeout_s: float = 20.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        self.ctx.destroy(linger=0)

    def __enter__(self) -> ThreadStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
