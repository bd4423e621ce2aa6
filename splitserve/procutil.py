"""Process hygiene done by each child itself at start (no preexec_fn: forking a multithreaded
parent such as a JAX process and running Python before exec can deadlock)."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PARENT_ENV = "SPLITSERVE_PARENT_PID"
CPUS_ENV = "SPLITSERVE_CPUS"
IO_CPUS_ENV = "SPLITSERVE_IO_CPUS"
API_KEY_ENV = "SPLITSERVE_API_KEY"  # the router's API key (never a flag: see router/__main__.py)
ADMIN_KEY_ENV = "SPLITSERVE_ADMIN_KEY"  # the admin endpoints' own key (router/http/admin.py)


def die_with_parent(environ: dict[str, str]) -> None:
    """SIGTERM this process when the launcher that started it dies (Linux): nothing is orphaned."""
    parent = environ.get(PARENT_ENV)
    if not parent:
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        return
    if os.getppid() != int(parent):  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def parse_cpus(spec: str) -> set[int]:
    """"0,1" or "2-3" -> {CPU numbers}."""
    cpus: set[int] = set()
    for part in spec.split(","):
        if part.strip():
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin_cpus(environ: dict[str, str]) -> None:
    """Restrict this process to the CPUs listed in SPLITSERVE_CPUS (e.g. "0,1" or "2-3")."""
    cpus = parse_cpus(environ.get(CPUS_ENV, ""))
    if cpus:
        os.sched_setaffinity(0, cpus)
        log.info("pinned to CPUs %s", sorted(cpus))


def place_io_threads(ctx, environ: dict[str, str]) -> None:
    """Put the ZeroMQ I/O threads of `ctx` on the CPUs in SPLITSERVE_IO_CPUS (before its first
    socket). A decode worker that owns a CPU then spends it on engine steps only: the socket
    work of its sends and receives, and the thread wake-ups, happen on the CPUs named here."""
    import zmq

    for cpu in sorted(parse_cpus(environ.get(IO_CPUS_ENV, ""))):
        ctx.set(zmq.THREAD_AFFINITY_CPU_ADD, cpu)


def freeze_startup_objects() -> None:
    """Leave the objects made at start-up (imported modules, tokenizer tables, the engine's
    wrappers) out of every later garbage collection: they live as long as the process.

    A full collection walks every tracked object: with these inside, tens of thousands of them
    in the router and more in a decode worker, each one pauses its process for tens of
    milliseconds (gc.callbacks shows it), and a router's pause stalls every stream. Call it once
    the process is set up, before its loop serves.
    """
    gc.collect()
    gc.freeze()
