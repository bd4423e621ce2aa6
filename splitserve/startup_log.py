"""A worker's start-up, said as it happens: loading the model, then each program of the warm-up
(which shape, n of N, whether it came from the compilation cache, how long it took), then Ready.

A cold start of the default model compiles for minutes on a small machine, and a single program
can take longer than an operator waits for a sign of life; so a ticker thread also logs, when
nothing was logged for quiet_s, what the worker is still doing and for how long.

The JAX engine says where each program came from (its executable store, or a compile:
splitserve/engine/executables.py). Where an engine does not say, whether a program came from
JAX's persistent compilation cache is read from JAX's own monitoring
events ('/jax/compilation_cache/compile_requests_use_cache' and '.../cache_hits'), which JAX
records on the thread that compiles; the engine reports each program on that same thread
(JaxEngine.warmup's progress callback), so the events seen on a thread since its previous program
are that program's. Compile time alone would not tell: on a loaded machine a cache read can take
as long as a small compile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

QUIET_S = 5.0  # the longest a starting worker stays silent
USE_CACHE = "/jax/compilation_cache/compile_requests_use_cache"
CACHE_HIT = "/jax/compilation_cache/cache_hits"


class CacheEvents:
    """JAX's compilation-cache events, counted per thread while registered."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[int, str]] = Counter()
        self._seen: dict[int, tuple[int, int]] = {}
        self._registered = False

    def register(self) -> None:
        import jax.monitoring

        jax.monitoring.register_event_listener(self.on_event)
        self._registered = True

    def unregister(self) -> None:
        if self._registered:
            import jax.monitoring

            jax.monitoring.unregister_event_listener(self.on_event)
            self._registered = False

    def on_event(self, event: str, **_kwargs) -> None:
        if event in (USE_CACHE, CACHE_HIT):
            self.counts[(threading.get_ident(), event)] += 1  # this thread's own key: no race

    def source_since_last(self) -> str:
        """How this thread's latest program came to be: "cache", "compiled" (a miss, now
        written to the cache) or "compiled, no cache" (the cache is off)."""
        me = threading.get_ident()
        uses, hits = self.counts[(me, USE_CACHE)], self.counts[(me, CACHE_HIT)]
        used_before, hit_before = self._seen.get(me, (0, 0))
        self._seen[me] = (uses, hits)
        if uses == used_before:
            return "compiled, no cache"
        return "cache" if hits - hit_before == uses - used_before else "compiled"


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
        self.cache = CacheEvents()
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

    def watch_compilation_cache(self) -> None:
        """Tell cache hits from compiles (JAX engines only: the fake one compiles nothing)."""
        self.cache.register()

    def phase(self, what: str) -> None:
        self.what = what
        self.say("%s: %s", self.name, what)

    def compiled(
        self, key: tuple, done: int, total: int, seconds: float, source: str | None = None
    ) -> None:
        """JaxEngine.warmup's progress callback (called on the compiling thread). source: where
        the engine got the program ("cache", "compiled" or "compiled, no cache"); when the
        engine does not say, JAX's own cache events on this thread tell."""
        source = source or self.cache.source_since_last()
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
        self.cache.unregister()
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
