"""An engine's compiled programs: one executable per program key, and where each comes from.

1. `get` is the lookup every call makes; a key missing there (one the warm-up does not cover,
   such as a prompt-logprobs length) is obtained on first use.
2. `obtain` loads a key's executable from the ExecutableStore when it has one
   (compile/executables.py: no trace, no lowering), else lowers and compiles what the
   engine's `Lowering` gives for the key (its jitted function and argument specs), with its
   kind's XLA options (compile/xla_options.py), and stores it for the next start.
3. `warmup` obtains the given keys before the worker says Ready, on a few threads (XLA
   compiles and loads without holding the GIL), reporting each one (which, n of N, from
   where). The `later` keys (each has a stand-in the engine runs meanwhile) are loaded then
   only when the store has them; the others compile after Ready on a background thread
   (`compile_in_background`), each once the worker has been idle a moment. Lookups never wait
   for them: `deferred(key)` says whether the stand-in must run.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import jax

from splitserve.engine.compile.background import start_compiling, wait_for_quiet
from splitserve.engine.compile.executables import ExecutableStore
from splitserve.engine.compile.xla_options import compile_options

log = logging.getLogger(__name__)

# How an executable came to be, as the start-up log says it (splitserve/startup_log.py).
FROM_STORE, COMPILED, NO_STORE = "cache", "compiled", "compiled, no cache"


class Lowering(Protocol):
    def lowered(self, key: tuple) -> tuple[Callable, list]:
        """The jitted function of a program key and the arguments (specs) it is lowered with."""


class ProgramTable:
    """The executables of one engine, by program key (a tuple whose first item is its kind)."""

    def __init__(self, lowering: Lowering, store: ExecutableStore | None = None):
        self.lowering = lowering
        self.store = store
        self.compiled: dict[tuple, jax.stages.Compiled] = {}
        # keys the background thread has still to obtain; a lookup never waits for one
        self.pending: frozenset[tuple] = frozenset()
        self._handed: frozenset[tuple] = frozenset()  # every key given to it (a failed one too)
        self._later: tuple[tuple, ...] = ()  # those warm-up left for compile_in_background
        self.background: threading.Thread | None = None
        self._stop_background: threading.Event | None = None

    def get(self, key: tuple) -> jax.stages.Compiled:
        """The executable for one shape, obtained on first use."""
        program = self.compiled.get(key)
        if program is None:
            program = self.obtain(key)[0]
            self.compiled[key] = program
        return program

    def obtain(self, key: tuple) -> tuple[jax.stages.Compiled, str]:
        """(executable, where it came from): the store, or a compile (then stored)."""
        store = self.store
        if store is not None:
            program = store.load(key)
            if program is not None:
                return program, FROM_STORE
        fn, args = self.lowering.lowered(key)
        program = fn.lower(*args).compile(compiler_options=compile_options(key[0]))
        if store is None:
            return program, NO_STORE
        store.save(key, program)
        return program, COMPILED

    def pending_count(self, kind: str) -> int:
        """How many keys of one kind the background thread has still to obtain (the workers'
        load reports say it; benchmarks wait for 0)."""
        return sum(1 for key in self.pending if key[0] == kind)

    def deferred(self, key: tuple) -> bool:
        """Whether key was left to the background and is not here (still compiling, or it
        failed to): its stand-in runs, and no request's path ever compiles it."""
        return key in self._handed and key not in self.compiled

    @property
    def any_deferred(self) -> bool:
        """Whether warm-up left any key to the background."""
        return bool(self._handed)

    def warmup(
        self, keys: Sequence[tuple], later: Sequence[tuple], threads: int | None = None,
        progress: Callable[..., None] | None = None, background: bool = True,
        quiet: Callable[[], bool] | None = None,
    ) -> None:  # fmt: skip
        """Obtain every key in `keys` but those in `later`, and the `later` ones the store has;
        the rest of `later` compile in the background, from here, or when
        compile_in_background() is called if background is False.

        progress(key, done, total, seconds, source) is called as each program is ready, on
        the thread that obtained it; source is FROM_STORE, COMPILED or NO_STORE. quiet: see
        compile_in_background.
        """
        later = [k for k in later if k not in self.compiled]
        skip = set(later) | set(self.compiled)
        todo = [k for k in keys if k not in skip]
        threads = threads or min(4, os.cpu_count() or 1)
        done = itertools.count(1)  # next() is atomic: the compile threads share it

        def obtain(key: tuple):
            start = time.perf_counter()
            program, source = self.obtain(key)
            if progress is not None:
                progress(key, next(done), len(todo), time.perf_counter() - start, source)
            return program

        store = self.store
        stored = store.load if store is not None else (lambda key: None)
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="compile") as pool:
            for key, program in zip(todo, pool.map(obtain, todo), strict=True):
                self.compiled[key] = program
            for key, program in zip(later, pool.map(stored, later), strict=True):
                if program is not None:
                    self.compiled[key] = program
        if store is not None and store.rejected:  # each was logged as it was met
            log.warning("stored executables not run and compiled again: %s",
                        dict(store.rejected))  # fmt: skip
        self._later = tuple(k for k in later if k not in self.compiled)
        self.pending = self._handed = frozenset(self._later)
        if background:
            self.compile_in_background(quiet)

    def compile_in_background(
        self, quiet: Callable[[], bool] | None = None
    ) -> threading.Thread | None:
        """Compile the keys warm-up left, one by one, on a daemon thread; `compiled` takes each
        as it is ready, and a lookup never waits for one.

        quiet() (the worker's idle(); None: always) is what keeps the compiles off the requests'
        CPU: each program starts only once quiet() has held a moment (background.py). The
        thread keeps the process's CPU priority: tracing, lowering and parts of every compile
        hold the GIL, and a thread that holds it while the scheduler passes it over (a lower
        priority) holds up every other thread of the worker, its heartbeat's included, which
        made the router declare a live decode worker dead on a cold start."""
        keys, self._later = self._later, ()
        if not keys:
            return None
        stop = self._stop_background = threading.Event()

        def run() -> None:
            for key in keys:
                if not wait_for_quiet(quiet, stop):  # close(): the rest stay deferred
                    return
                try:
                    self.compiled[key] = self.obtain(key)[0]
                except Exception:  # a program that will not compile: its stand-in stays
                    log.exception("compiling %s after warm-up failed", key)
                self.pending = self.pending - {key}  # attempts left; only this thread writes
            log.info("%d programs compiled after warm-up", len(keys))

        self.background = start_compiling(run, stop)
        return self.background

    def close(self) -> None:
        """Stop the background compiles after the program in hand (a stopping worker must
        not spend minutes of CPU on programs nobody will run, nor exit inside a compile)."""
        if self._stop_background is not None:
            self._stop_background.set()
        if self.background is not None:
            self.background.join()
