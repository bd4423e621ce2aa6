"""Compiles after warm-up, on a daemon thread each: when they start, and how they end with the
process.

A daemon thread killed inside an XLA compile at interpreter exit aborts the process (C++
terminate, exit status 134), so at exit each is stopped after the program it is compiling. The
hook must run before JAX's own exit handlers and before weakref.finalize's, which JAX's tracing
registers later than this module's import and which drops the constants of a trace in flight
(the compile then failed with a KeyError on a parameter's Var): start_compiling registers it
again, last, each time (atexit runs the newest hook first).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable

# How long the worker must have been idle before a deferred program starts compiling (seconds
# of a core each): a request that comes meanwhile shares the CPU with that one compile only.
QUIET_BEFORE_COMPILE_S = 1.0
QUIET_POLL_S = 0.1

# This process's background compiles, each (stop event, thread).
_running: set[tuple[threading.Event, threading.Thread]] = set()


@atexit.register
def _stop_background_compiles() -> None:
    for stop, _ in list(_running):
        stop.set()
    for _, thread in list(_running):
        thread.join()


def wait_for_quiet(quiet: Callable[[], bool] | None, stop: threading.Event) -> bool:
    """Wait until quiet() has been true for QUIET_BEFORE_COMPILE_S; False once stop is set."""
    if quiet is None:
        return not stop.is_set()
    since = None
    while not stop.is_set():
        now = time.monotonic()
        if not quiet():
            since = None
        elif since is None:
            since = now
        elif now - since >= QUIET_BEFORE_COMPILE_S:
            return True
        stop.wait(QUIET_POLL_S)
    return False


def start_compiling(run: Callable[[], None], stop: threading.Event) -> threading.Thread:
    """run() on a daemon thread that `stop` ends (run must look at it between programs) and
    that the process's exit stops and waits for."""
    atexit.unregister(_stop_background_compiles)
    atexit.register(_stop_background_compiles)

    def tracked() -> None:
        try:
            run()
        finally:
            _running.discard((stop, thread))

    thread = threading.Thread(target=tracked, name="compile-deferred", daemon=True)
    _running.add((stop, thread))
    thread.start()
    return thread
