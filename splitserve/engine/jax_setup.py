"""Process-wide JAX settings, applied by worker entry points (never at import).

- `configure_jax_runtime`: how XLA runs on the CPU. Must run before JAX's first
  computation (the CPU client reads these settings once, when it is created).
"""

from __future__ import annotations

import logging
import os

import jax

log = logging.getLogger(__name__)

# XLA:CPU flags measured on this project's 2-core benchmark machine with jaxlib 0.10.x: its
# default YNNPACK matmuls run the decode step's [slots, hidden] x [hidden, N] products at
# half the speed of the Eigen ones; YNNPACK stays on for reductions, where it is faster.
# Experimental flags change between jaxlib releases and an unknown flag aborts the process,
# so they are applied only to the release line they were measured on.
_XLA_CPU_FLAGS = {"0.10.": ("--xla_cpu_experimental_ynn_fusion_type=reduce",)}


def backend_started() -> bool:
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started else bool(getattr(xla_bridge, "_backends", None))


def configure_jax_runtime(
    *, synchronous_cpu: bool = True, cpu_threads: int | None = None, tuned_flags: bool = True
) -> None:
    """Runtime settings for a worker; call before JAX runs its first computation.

    synchronous_cpu: run each CPU program inline on the calling thread instead of handing it
      to a dispatch thread. The engine reads every step's tokens back at once, so async
      dispatch buys no overlap, and on a small virtual machine the hand-off between threads
      costs tens to hundreds of microseconds per call.
    cpu_threads: size of XLA's intra-op thread pool (default: one per CPU). XLA sizes it from
      the CPU affinity mask when the client starts, so the mask is narrowed for that moment
      and restored after: the process still runs on every CPU. 1 suits a decode worker that
      shares a small machine with other workers (no cross-core hand-offs inside a step).
    tuned_flags: add the measured XLA:CPU flags above (only on the jaxlib they suit).
    """
    if backend_started():
        log.warning("configure_jax_runtime called after JAX started; settings not applied")
        return
    jax.config.update("jax_cpu_enable_async_dispatch", not synchronous_cpu)
    if tuned_flags:
        from jaxlib import version

        for prefix, flags in _XLA_CPU_FLAGS.items():
            if version.__version__.startswith(prefix):
                current = os.environ.get("XLA_FLAGS", "")
                extra = [f for f in flags if f.split("=")[0] not in current]
                os.environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()
    if cpu_threads and hasattr(os, "sched_setaffinity"):
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(sorted(allowed)[:cpu_threads]))
        try:
            jax.devices("cpu")  # creates the client (and its thread pool) now
        finally:
            os.sched_setaffinity(0, allowed)
