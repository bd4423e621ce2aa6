"""The ceiling in a child process that stays up (`splitserve bench --ceiling --probe`: a probe
that measures once per line read), measured again whenever asked.

A benchmark suite on a shared host measures the ceiling between its served loads, seconds before
and after each, so that the engine's drift over minutes stays out of each served/ceiling ratio.
The child builds the engine once; each measurement then costs only its own steps. Between
measurements it sleeps on its stdin and takes no CPU from the served stack.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any


class CeilingProcessError(RuntimeError):
    pass


class CeilingProcess:
    def __init__(
        self,
        args: list[str],
        log: IO[bytes],
        cwd: str | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ):
        """args: the `splitserve bench --ceiling` options (model, engine, slots, context...)."""
        cmd = [sys.executable, "-m", "splitserve.bench", "--ceiling", "--probe", *args]
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            preexec_fn=preexec_fn, text=True,
        )  # fmt: skip

    def measure(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """One measurement (the first also waits for the engine's build)."""
        proc = self.proc
        if proc.poll() is not None:
            raise CeilingProcessError(f"the ceiling process exited with status {proc.returncode}")
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write("measure\n")
            proc.stdin.flush()
        except BrokenPipeError:
            raise CeilingProcessError(f"the ceiling process ended (status {proc.wait()})") from None
        deadline = time.monotonic() + timeout_s
        while True:  # a library that prints to stdout must not pass for a measurement
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if not ready:
                self.close()
                raise CeilingProcessError(f"no measurement in {timeout_s:.0f} s")
            line = proc.stdout.readline()
            if not line:
                raise CeilingProcessError(f"the ceiling process ended (status {proc.wait()})")
            if line.startswith("{"):
                return json.loads(line)

    def close(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            try:
                if proc.stdin:
                    proc.stdin.close()  # its loop ends with its input
                proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                proc.kill()
                proc.wait()

    def __enter__(self) -> CeilingProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pin_to(cpus: list[int] | None) -> Callable[[], None] | None:
    """A preexec_fn that narrows the child to `cpus` (XLA sizes its thread pool from the mask)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)
