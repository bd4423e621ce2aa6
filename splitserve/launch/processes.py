"""Roles as OS processes: spawn, kill, restart, and stop them in order.

ProcessStack spawns `python -m <role> --config FILE --index K` per role, each child in its own
session (so that a terminal's Ctrl-C reaches only the launcher, which then stops the children in
order); each child asks for a parent-death signal itself (procutil), so that none outlives a
launcher that was killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from splitserve.config import ClusterConfig
from splitserve.launch.roles import role_instances, role_module, stack_roles, write_config_files
from splitserve.procutil import ADMIN_KEY_ENV, API_KEY_ENV, CPUS_ENV, IO_CPUS_ENV, PARENT_ENV

log = logging.getLogger(__name__)

# the keys the router may get from this launcher's environment, and the file each is written to
# beside the children's cluster file (roles.write_config_files)
KEY_FILES = {API_KEY_ENV: "api_key", ADMIN_KEY_ENV: "admin_key"}

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
    """Roles as OS processes (by default a whole local stack: stack_roles; or the given
    instances, (role, index) each). Use as a context manager; stop() is safe to call twice.

    The children read the config from config_path, or from a file written into the run
    directory (with the API key, if any, in a 0600 file beside it), removed again by stop()."""

    def __init__(
        self,
        config: ClusterConfig,
        roles: Iterable[str] | None = None,
        env: dict[str, str] | None = None,
        log_dir: str | None = None,
        cpus: dict[str, list[int]] | None = None,
        config_path: str | None = None,
        instances: Iterable[tuple[str, int]] | None = None,
    ):
        self.config = config
        self.roles = tuple(stack_roles(config) if roles is None else roles)
        self.instances = (
            list(instances) if instances is not None else role_instances(config, self.roles)
        )
        env = dict(os.environ if env is None else env)
        keys = {name: env.pop(name, "") for name in KEY_FILES}
        self.env = env
        self.log_dir = log_dir
        # role -> CPUs its processes are pinned to (default: the config's [cluster.cpus])
        self.cpus = {r: list(cs) for r, cs in (config.cpus if cpus is None else cpus).items()}
        self.written = [] if config_path else write_config_files(config)
        self.config_path = config_path or self.written[0]
        # the router reads each key from the file written for it; else from the environment
        # this launcher got (a host's launcher on the user's own file): the router's alone
        files = {os.path.basename(path) for path in self.written[1:]}
        self.router_env = {name: key for name, key in keys.items()
                           if key and KEY_FILES[name] not in files}  # fmt: skip
        self.children: dict[tuple[str, int], Child] = {}
        self.retired: list[Child] = []  # stopped for good (a shrunk pool): waited for at stop()

    def start(self) -> ProcessStack:
        for role, index in self.instances:
            self.spawn(role, index)
        return self

    def spawn(self, role: str, index: int) -> Child:
        cmd = [sys.executable, "-m", role_module(role, self.config.mode)]
        cmd += ["--config", self.config_path]
        cmd += ["--index", str(index)]
        log_path = None
        out = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            log_path = os.path.join(self.log_dir, f"{role}-{index}.log")
            out = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        env = {**self.env, **(self.router_env if role == "router" else {})}
        env[PARENT_ENV] = str(os.getpid())
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

    def retire(self, role: str, index: int) -> None:
        """Stop a child for good: SIGTERM (it drains), and it is neither watched nor restarted."""
        child = self.children.pop((role, index))
        if child.popen.poll() is None:
            child.popen.send_signal(signal.SIGTERM)
        self.retired.append(child)

    def dead(self) -> list[Child]:
        return [c for c in self.children.values() if c.popen.poll() is not None]

    def pids(self) -> list[int]:
        return [c.popen.pid for c in self.children.values()]

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the router first (it drains), then the workers; SIGKILL what is left."""
        order = sorted([*self.children.values(), *self.retired], key=lambda c: c.role != "router")
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
        for path in self.written:  # the children's config and key: read at their start only
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.written = []

    def __enter__(self) -> ProcessStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
