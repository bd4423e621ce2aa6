"""Process hygiene done by each child itself at start (no preexec_fn: forking a multithreaded
parent such as a JAX process and running Python before exec can deadlock)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PARENT_ENV = "SPLITSERVE_PARENT_PID"
CPUS_ENV = "SPLITSERVE_CPUS"


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


def pin_cpus(environ: dict[str, str]) -> None:
    """Restrict this process to the CPUs listed in SPLITSERVE_CPUS (e.g. "0,1" or "2-3")."""
    spec = environ.get(CPUS_ENV, "").strip()
    if not spec:
        return
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, cpus)
    log.info("pinned to CPUs %s", sorted(cpus))
