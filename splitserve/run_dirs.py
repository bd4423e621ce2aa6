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

One stack to a run directory: a second stack on the same one (a second `splitserve serve` of
deploy/one-host.toml) bound the same ipc sockets, took the first one's traffic, and hung in
"starting" without a word. So the processes hold locks in it (flock, released by the kernel
when the holder dies, however it dies), each file naming its holder:
- `launcher.lock`: held by the launcher (`splitserve serve`) for its life. A second launcher is
  refused at once, naming the holder, before it writes anything there; so is a launcher on a
  run directory whose role processes run without one (supervisord's).
- `<role>-<index>.lock`: held by each role process for its life (supervisord runs no launcher,
  and restarts one program at a time: a restarted process finds its lock free). A second copy
  of a process is refused, and so is a role process that a launcher holding the directory did
  not start (it would join that launcher's stack behind its back).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time

PREFIX = "splitserve-"
OWNER_FILE = "launcher.pid"
LAUNCHER_LOCK = "launcher.lock"
# a role process checking the launcher's lock holds it shared for an instant: a launcher that
# meets that instant tries again this often before it calls the directory taken
LOCK_TRIES, LOCK_RETRY_S = 20, 0.01
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


class RunDirInUse(ValueError):
    """Another process holds the run directory (or this process's place in it)."""


def hold_for_launcher(path: str, what: str = "splitserve serve") -> int:
    """Lock run directory `path` for this launcher's life: the lock's descriptor (closing it, or
    exiting, releases it). RunDirInUse, naming the holder, when another launcher holds it or a
    role process runs there; nothing in the directory is changed then."""
    ensure_private_dir(path)
    lock_path = os.path.join(path, LAUNCHER_LOCK)
    existed = os.path.exists(lock_path)
    fd = _try_lock(lock_path)
    for _ in range(LOCK_TRIES):
        if fd is not None or not existed:
            break
        time.sleep(LOCK_RETRY_S)
        fd = _try_lock(lock_path)
    if fd is None:
        raise RunDirInUse(f"run dir {path} is in use by {_holder(lock_path)}")
    running = [_holder(p) for p in _role_locks(path) if _held(p)]
    if running:
        if not existed:
            _unlink(lock_path)
        os.close(fd)
        raise RunDirInUse(f"run dir {path} is in use by {', '.join(running)} (started "
                          "without this launcher: supervisord?)")  # fmt: skip
    _write_holder(fd, what)
    return fd


def hold_for_role(path: str, role: str, index: int, launcher_pid: str | None) -> int:
    """Lock this role process's place (role, index) in run directory `path` for its life: the
    descriptor. RunDirInUse when that process runs already, or when a launcher holds the
    directory and is not launcher_pid (this process's parent, from the launcher's environment)."""
    launcher = os.path.join(path, LAUNCHER_LOCK)
    if _held(launcher):
        pid = _holder(launcher).rsplit(" ", 1)[-1]
        if pid != launcher_pid:
            raise RunDirInUse(f"run dir {path} is in use by {_holder(launcher)}, which runs "
                              "its own processes")  # fmt: skip
    lock_path = os.path.join(path, f"{role}-{index}.lock")
    fd = _try_lock(lock_path)
    if fd is None:
        raise RunDirInUse(f"run dir {path} is in use by {_holder(lock_path)}")
    _write_holder(fd, f"{role}[{index}]")
    return fd


def _try_lock(path: str) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def _held(path: str) -> bool:
    """Some process holds the lock file at path now."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    return False


def _role_locks(path: str) -> list[str]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return [os.path.join(path, n) for n in sorted(names)
            if n.endswith(".lock") and n != LAUNCHER_LOCK]  # fmt: skip


def _write_holder(fd: int, what: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{what} pid {os.getpid()}\n".encode(), 0)


def _holder(lock_path: str) -> str:
    """Who holds a lock, as its file says ("splitserve serve pid 123", "prefill[0] pid 45")."""
    try:
        with open(lock_path) as fh:
            return fh.read().strip() or "another process"
    except OSError:
        return "another process"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
