"""Process-wide JAX settings, applied by worker entry points (never at import).

- `configure_jax_runtime`: how XLA runs on the CPU. Must run before JAX's first
  computation (the CPU client reads these settings once, when it is created).

XLA's compile options, which differ between prefill and decode programs, are given with each
compile instead (xla_options.py).
"""

from __future__ import annotations

import logging
import os

import jax

log = logging.getLogger(__name__)


def backend_started() -> bool:
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started else bool(getattr(xla_bridge, "_backends", None))


def configure_jax_runtime(*, synchronous_cpu: bool = True, cpu_threads: int | None = None) -> None:
    """Runtime settings for a worker; call before JAX runs its first computation.

    synchronous_cpu: run each CPU program inline on the calling thread instead of handing it
      to a dispatch thread. The engine reads every step's tokens back at once, so async
      dispatch buys no overlap, and on a small virtual machine the hand-off between threads
      costs tens to hundreds of microseconds per call.
    cpu_threads: size of XLA's intra-op thread pool (default: one per CPU). XLA sizes it from
      the CPU affinity mask when the client starts, so the mask is narrowed for that moment
      and restored after: the process still runs on every CPU. 1 suits a decode worker that
      shares a small machine with other workers (no cross-core hand-offs inside a step).
    """
    if backend_started():
        log.warning("configure_jax_runtime called after JAX started; settings not applied")
        return
    jax.config.update("jax_cpu_enable_async_dispatch", not synchronous_cpu)
    if cpu_threads and hasattr(os, "sched_setaffinity"):
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(sorted(allowed)[:cpu_threads]))
        try:
            jax.devices("cpu")  # creates the client (and its thread pool) now
        finally:
            os.sched_setaffinity(0, allowed)
