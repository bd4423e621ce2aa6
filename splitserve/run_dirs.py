"""Run directories: where a stack's ipc sockets, its children's cluster file and (0600) its API
key file live.

A run directory is private: created 0700, and one that exists already must be a real directory
(no symlink) of this user that no one else can enter, or it is refused: a run_dir such as
/tmp/splitserve pre-made by another user would otherwise hold our sockets.

A launcher that makes a fresh one (`splitserve serve` with a cluster file that names none, the
test and benchmark stacks) makes it under $TMPDIR as `splitserve-*` with an owner file naming
its pid and that process's start time; it removes the directory on a clean stop, and the next
launcher reclaims any whose owner is gone (killed, crashed). Without this, directories holding
stale sockets and cluster files piled up (57 on one machine).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time

PREFIX = "splitserve-"
OWNER_FILE = "launcher.pid"
# a directory of PREFIX without an owner file was made by an older version, or is being made
# right now (the owner file follows mkdtemp at once): it is reclaimed only once this old
LEGACY_AGE_S = 24 * 3600.0


def ensure_private_dir(path: str) -> str:
    """path as a directory only its owner (this user) can enter: made 0700 if missing; ValueError
    if it exists as anything else."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # whatever the umask
        return path
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"run_dir {path} exists and is not a directory (a symlink?)")
    if st.st_uid != os.geteuid():
        raise ValueError(f"run_dir {path} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        raise ValueError(
            f"run_dir {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}): "
            "chmod 700 it, or name another"
        )
    return path


def create(parent: str | None = None) -> str:
    """A fresh run directory owned by this process, after reclaiming stale ones."""
    parent = parent or tempfile.gettempdir()
    reclaim_stale(parent)
    path = tempfile.mkdtemp(prefix=PREFIX, dir=parent)  # 0700
    with open(os.path.join(path, OWNER_FILE), "w") as fh:
        fh.write(f"{os.getpid()} {process_start_time(os.getpid())}\n")
    return path


def owned_here(path: str) -> bool:
    """This process made the run directory (its owner file names us)."""
    return _owner(path) == (os.getpid(), process_start_time(os.getpid()))


def remove(path: str) -> bool:
    """Remove a run directory this process made (a clean stop); any other is left alone."""
    if not owned_here(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def reclaim_stale(parent: str) -> list[str]:
    """Remove this user's run directories under parent whose launcher is gone."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        if _stale(entry.path, st):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _stale(path: str, st: os.stat_result) -> bool:
    owner = _owner(path)
    if owner is None:
        return time.time() - st.st_mtime > LEGACY_AGE_S
    pid, started = owner
    return process_start_time(pid) != started  # dead, or its pid now another process's


def _owner(path: str) -> tuple[int, int] | None:
    try:
        with open(os.path.join(path, OWNER_FILE)) as fh:
            pid, started = fh.read().split()
        return int(pid), int(started)
    except (OSError, ValueError):
        return None


def process_start_time(pid: int) -> int:
    """When a process started (clock ticks since boot, /proc/PID/stat field 22); -1 if there is
    no such process. With the pid, it names a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return -1
    if fields[0] == "Z":  # a zombie has exited
        return -1
    return int(fields[19])
