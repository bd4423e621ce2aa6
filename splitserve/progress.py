"""A process's progress record: how its launcher (and a worker's Kubernetes probe) tell a process
that stopped from one that is busy. The router keeps one too (router/inbox.py: its inbox's
thread for the heartbeat thread, its liveness monitor for the loop).

A worker frozen by SIGSTOP (or wedged in a way that stops its threads) used to be left alone for
good: its process had not exited, so no supervisor restarted it, while the router answered 503
"a worker is being replaced". So each worker process keeps a small file in the run directory,
`<role>-<index>.progress`, mapped into memory (as splitserve/core_share.py's marks file is),
that its heartbeat thread rewrites at every heartbeat: its pid, when that thread last ran and
when the worker's loop last completed a pass (CLOCK_MONOTONIC seconds, one clock for every
process of a host), with a checksum, so a read that meets a half-written record skips it.

The judgment (stuck_reason): the heartbeat thread silent for [lifecycle] stuck_timeout_s means
the process is stopped; a long prefill or compile does not silence it (JAX releases the GIL
while it computes, and the thread beats on). The loop is judged only against the much longer
loop_stuck_timeout_s, since one engine call may legitimately hold it that long. A record of
another pid (the worker's previous run) says nothing about this one: a worker is judged only
once it has written its own, i.e. after its warm-up.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass

SUFFIX = ".progress"
_BODY = struct.Struct("<qdd")  # pid, heartbeat thread's last run, loop's last pass
_SIZE = _BODY.size + 4  # and the body's CRC-32


def progress_path(run_dir: str, role: str, index: int) -> str:
    return os.path.join(run_dir, f"{role}-{index}{SUFFIX}")


@dataclass(frozen=True)
class Progress:
    pid: int
    beat_at: float  # time.monotonic() when the heartbeat thread last wrote
    loop_at: float  # time.monotonic() when the loop last completed a pass


class ProgressRecord:
    """The worker's side: its record, mapped, rewritten by write()."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, _SIZE)
            self.map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self.pid = os.getpid()

    def write(self, beat_at: float, loop_at: float) -> None:
        body = _BODY.pack(self.pid, beat_at, loop_at)
        self.map[:] = body + struct.pack("<I", zlib.crc32(body))

    def close(self) -> None:
        self.map.close()


def read_progress(path: str) -> Progress | None:
    """The record at path; None when there is none, or it is torn (being written)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_SIZE)
    except OSError:
        return None
    if len(data) != _SIZE:
        return None
    body, (crc,) = data[: _BODY.size], struct.unpack("<I", data[_BODY.size :])
    if zlib.crc32(body) != crc:
        return None
    return Progress(*_BODY.unpack(body))


def stuck_reason(
    progress: Progress, now: float, stuck_timeout_s: float, loop_stuck_timeout_s: float
) -> str | None:
    """Why the worker of this record makes no progress, or None (a bound of 0: not judged)."""
    silent = now - progress.beat_at
    if stuck_timeout_s and silent > stuck_timeout_s:
        return f"its heartbeat thread has not run for {silent:.0f} s (stopped?)"
    idle = now - progress.loop_at
    if loop_stuck_timeout_s and idle > loop_stuck_timeout_s:
        return f"its loop has not completed a pass for {idle:.0f} s"
    return None
