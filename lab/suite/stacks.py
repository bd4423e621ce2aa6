"""A section's served stack in one mode: the launcher's ProcessStack on a free port (the same
processes `splitserve serve` starts), ready when /health says 200, always stopped."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any

from lab.suite.cpus import Cpus
from lab.suite.sections import Section
from splitserve.config import config_from_dict
from splitserve.launch.health import StackNotReady, health_url, wait_ready
from splitserve.launch.ports import free_port
from splitserve.launch.processes import ProcessStack
from splitserve.launch.roles import write_config

log = logging.getLogger(__name__)


class SuiteStack:
    """One stack of section `s` in `mode`; logs and config under work_dir; stop() always tears
    it down."""

    def __init__(self, s: Section, mode: str, work_dir: str, cpus: Cpus, attempt: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = f"{s.key}-{mode}" + (f"-try{attempt}" if attempt > 1 else "")
        run_dir = tempfile.mkdtemp(prefix=f"ss-suite-{self.name}-")
        raw: dict[str, Any] = {
            "model": {
                "engine": s.engine,
                "path": s.model if s.engine == "jax" else "default",
                "tokenizer": s.tokenizer,
                "num_slots": s.slots,
                "max_seq_len": s.max_seq_len,
                "cpu_threads": s.cpu_threads,
            },
            "cluster": {"mode": mode, "detok_workers": 2, "run_dir": run_dir},
            # a load above what the server sustains queues at the router: let it wait (a client
            # of a benchmark does) rather than answer 429 after the default 30 s
            "router": {"host": "127.0.0.1", "port": self.port, "max_running": s.max_running,
                       "max_queued": 512, "queue_timeout_s": 600.0},  # fmt: skip
        }
        layout = cpus.layout() if s.pin_roles else None
        if layout and mode == "processes":
            engine_cpus, rest = layout
            raw["cluster"]["cpus"] = {"decode": engine_cpus, "prefill": rest, "detok": rest,
                                      "router": rest, "io": rest}  # fmt: skip
        self.config = config_from_dict(raw)
        self.log_dir = os.path.join(work_dir, self.name)
        self.stack = ProcessStack(
            self.config,
            log_dir=self.log_dir,
            config_path=write_config(self.config, os.path.join(work_dir, f"{self.name}.toml")),
        )
        self.ready_timeout_s = s.ready_timeout_s

    def start(self) -> None:
        t0 = time.monotonic()
        self.stack.start()
        try:
            wait_ready(health_url(self.config), self.ready_timeout_s, stack=self.stack)
        except StackNotReady as exc:
            raise StackNotReady(f"{self.name} not ready: {exc} (logs: {self.log_dir})",
                                exc.exited) from None  # fmt: skip
        log.info("%s: ready in %.0f s", self.name, time.monotonic() - t0)

    def stop(self) -> None:
        """The router first (it drains), then the workers; what does not stop in time is killed."""
        self.stack.stop(timeout_s=self.config.lifecycle.drain_timeout_s + 10)


def start_stack(
    s: Section, mode: str, work_dir: str, cpus: Cpus, started: list[SuiteStack]
) -> SuiteStack:
    """A ready stack (each one made is added to `started`, for the caller to stop). A second,
    fresh one if the first never gets ready: on a shared host a stray signal or a port taken
    in between should not cost a whole section."""
    for attempt in (1, 2):
        stack = SuiteStack(s, mode, work_dir, cpus, attempt)
        started.append(stack)
        try:
            stack.start()
            return stack
        except StackNotReady as exc:
            if attempt == 2:
                raise
            log.info("%s; retrying once with a fresh stack", exc)
            stack.stop()
    raise AssertionError("unreachable")
