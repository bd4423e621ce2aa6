"""A worker's start-up, said as it happens: loading the model, then each program of the warm-up
(which shape, n of N, whether it came from the compilation cache, how long it took), then Ready.

A cold start of the default model compiles for minutes on a small machine, and a single program
can take longer than an operator waits for a sign of life; so a ticker thread also logs, when
nothing was logged for quiet_s, what the worker is still doing and for how long.

The JAX engine says where each program came from: its executable store, or a compile
(splitserve/engine/compile/executables.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

QUIET_S = 5.0  # the longest a starting worker stays silent


class StartupLog:
    """Use: start(), phase("loading the model"), compiled(...) per program, done()."""

    def __init__(
        self,
        name: str,
        log: logging.Logger,
        quiet_s: float = QUIET_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name = name
        self.log = log
        self.quiet_s = quiet_s
        self.clock = clock
        self.began = self.last = clock()
        self.what = "starting"
        self.programs = (0, 0)  # done, total
        self.from_cache = 0
        self._done = threading.Event()
        self._lock = threading.Lock()  # compile threads and the ticker log through say()
        self._ticker: threading.Thread | None = None

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def start(self) -> StartupLog:
        self._ticker = threading.Thread(target=self._tick, name=f"{self.name}-startup",
                                        daemon=True)  # fmt: skip
        self._ticker.start()
        return self

    def phase(self, what: str) -> None:
        self.what = what
        self.say("%s: %s", self.name, what)

    def compiled(self, key: tuple, done: int, total: int, seconds: float, source: str) -> None:
        """JaxEngine.warmup's progress callback (called on the compiling thread). source: where
        the engine got the program ("cache": its executable store, "compiled", or "compiled, no
        cache")."""
        with self._lock:
            self.programs = (max(done, self.programs[0]), total)
            self.from_cache += source == "cache"
        shape = f"{key[0]}({', '.join(str(k) for k in key[1:])})"
        self.say(
            "%s: warm-up %d/%d: %s in %.1f s (%s)", self.name, done, total, shape, seconds,
            source, extra={"warmup": {"program": shape, "n": done, "of": total,
                                      "seconds": round(seconds, 3), "source": source}},
        )  # fmt: skip

    def done(self) -> None:
        self._done.set()
        done, total = self.programs
        cached = f", {self.from_cache} of {total} programs from the compilation cache"
        cached = cached if total else ""
        self.say("%s: started in %.1f s%s", self.name, self.clock() - self.began, cached)

    def say(self, msg: str, *args, extra: dict | None = None) -> None:
        with self._lock:
            self.last = self.clock()
        self.log.info(msg, *args, extra=extra)

    def _tick(self) -> None:
        while not self._done.wait(min(1.0, self.quiet_s)):
            now = self.clock()
            if now - self.last < self.quiet_s:
                continue
            done, total = self.programs
            progress = f", {done}/{total} programs ready" if total else ""
            self.say("%s: still %s after %.0f s%s", self.name, self.what, now - self.began,
                     progress)  # fmt: skip
