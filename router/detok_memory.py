"""Whether this host can hold the detok workers a resize of the pool adds.

POST /admin/detok-workers once took any count up to 256 (about 21 GiB of detok workers on a
23 GiB host), and the launcher started them all at once. A growth is now refused (409, naming
the memory needed and the memory available) when the workers it adds, each counted at what a
detok worker takes, exceed what the host has available: MemAvailable (/proc/meminfo), or less
where this process's cgroup (a container) limits it. What a worker takes is [router]
detok_worker_mib when set; else the largest resident set (VmRSS) of the pool's workers that run
on this host (a pid whose command line is a detok worker's); else DETOK_WORKER_ESTIMATE_MIB.
The launcher that starts them runs beside the router (`splitserve serve`); under supervisord the
operator starts them, and the check is of the router's host all the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

# What a detok worker of the default model holds resident once started (its tokenizer and the
# interpreter), with room for its streams' state.
DETOK_WORKER_ESTIMATE_MIB = 96
MIB = 1 << 20


def available_bytes() -> int | None:
    """Memory this process's host (or container) has available now; None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    limit = _cgroup_room()
    return available if limit is None else min(available, limit)


def _cgroup_room() -> int | None:
    """memory.max less memory.current of this process's cgroup (v2), None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        with open(os.path.join(base, "memory.max")) as f:
            limit = f.read().strip()
        with open(os.path.join(base, "memory.current")) as f:
            current = int(f.read())
    except (OSError, StopIteration, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - current)


def detok_worker_bytes(pids: Iterable[int], configured_mib: float = 0) -> tuple[int, str]:
    """What one detok worker is counted at, and how that was found."""
    if configured_mib:
        return int(configured_mib * MIB), "[router] detok_worker_mib"
    measured = [rss for rss in map(_detok_rss, pids) if rss]
    if measured:
        return max(measured), "the largest running detok worker's resident memory"
    return DETOK_WORKER_ESTIMATE_MIB * MIB, "an estimate"


def _detok_rss(pid: int) -> int | None:
    """VmRSS of pid if it is a detok worker process of this host."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"detok_worker" not in f.read():
                return None
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def growth_refusal(
    count: int, running: int, per_worker: tuple[int, str], available: int | None
) -> str | None:
    """Why a pool of `count` workers (`running` of them up now) does not fit, or None."""
    new = count - running
    if new <= 0 or available is None:
        return None
    each, how = per_worker
    need = new * each
    if need <= available:
        return None
    return (f"{count} detok workers need about {need // MIB} MiB more ({new} new, "
            f"{each // MIB} MiB each: {how}), and this host has {available // MIB} MiB "
            "available")  # fmt: skip
