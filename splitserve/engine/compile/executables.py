"""Compiled programs kept on disk as serialized XLA executables, so that a restart loads each
one in a fraction of a second instead of tracing and lowering it again.

JAX's persistent compilation cache is keyed by the lowered program, so even a hit first traces
and lowers the function, for each of a decode worker's programs (a deep model's decode step
takes long to trace, more so under load). This store is keyed instead by what determines a
program: its shape key, the engine's configuration (the `engine` part of the key) and the
build (`build_identity`: the JAX and jaxlib versions, the CPU, XLA's flags, the engine's own
source files and the native kernel). A change to any of them is a different key, so a stale
executable is never loaded.

An executable that JAX itself loaded from its persistent cache serializes without its machine
code (its first call then fails: "Function ... not found"), so an engine that keeps its programs
here compiles them with JAX's cache off (splitserve.engine.build_engine uses one or the other).

Entries are written whole (a temporary name, then a rename), so concurrent workers and a crash
mid-write leave no torn file; they are read only when this user owns them and nobody else may
write them, because an executable is machine code the worker runs. A file that does not load
(truncated, or from another build that hashed the same) is removed and the program compiled.

What XLA deserializes is trusted to be what it serialized: a damaged file can load without an
error and then abort the process inside LLVM ("invalid section index"), at every start, since
the file stays. So each entry carries the SHA-256 of its payload in a header written with it
(in the same file, so that one rename publishes both and they can never disagree), checked
before anything is deserialized: a mismatch is removed, counted (`rejected`) and logged, and
the program compiled again. And a load that kills the process is not tried again from the same
file: a loader holds `<entry>.loading` locked (flock) and written while XLA reads the entry, and
removes it after. A marker that outlives its loader (the lock is free, the file holds its pid)
means that loader died inside the load: the entry is removed, counted and logged, and the
program compiled again. A marker locked by a live loader (another worker loading the same
program) is waited for, and a worker stopped while it starts removes its own (abandon_loads).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import pickle
import platform
import stat
import tempfile
import threading
from collections import Counter

import jax

log = logging.getLogger(__name__)

FORMAT = "splitserve-executables-2"  # bump when the file layout changes
MAGIC = b"splitserve-xla-2\n"  # an entry: MAGIC, the payload's SHA-256, the payload
DIGEST_BYTES = hashlib.sha256().digest_size
LOADING = ".loading"  # beside an entry while it is being loaded (the crash marker)
KEEP_BYTES = 2 << 30  # the store's size bound (the default model's programs take about 0.2 GiB)
# the engine package (this module's folder's parent): its code is part of the build identity
_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the markers of this process's loads in flight (no lock: abandon_loads runs in a signal handler,
# and a set's add and discard are atomic)
_loading: set[str] = set()


def build_identity() -> str:
    """What makes an executable of this process loadable and correct: a hex digest."""
    from jaxlib import version as jaxlib_version

    h = hashlib.sha256()
    device = jax.devices()[0]
    for part in (FORMAT, jax.__version__, jaxlib_version.__version__, device.platform,
                 device.device_kind, getattr(device.client, "platform_version", ""),
                 platform.machine(), _cpu_flags(), os.environ.get("XLA_FLAGS", ""),
                 os.environ.get("SPLITSERVE_QKERNEL", ""),
                 str(jax.config.jax_enable_x64),
                 str(jax.config.jax_default_matmul_precision)):  # fmt: skip
        h.update(part.encode() + b"\0")
    # the engine's code (any .py of this package and its sub-packages, and the native kernel
    # it calls) shapes the programs: an edited file must never meet an executable compiled
    # from the old one
    for name in _engine_files(_ENGINE_DIR):
        with open(os.path.join(_ENGINE_DIR, name), "rb") as f:
            h.update(name.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _engine_files(root: str) -> list[str]:
    """The .py and .so files under root, as sorted paths relative to it."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found += [os.path.relpath(os.path.join(folder, name), root) for name in files
                  if name.endswith((".py", ".so"))]  # fmt: skip
    return sorted(found)


def _cpu_flags() -> str:
    """The CPU's model and feature flags (XLA:CPU compiles for the host's instruction set)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().split("\n\n")[0].splitlines()
    except OSError:
        return platform.processor()
    keep = ("model name", "flags", "Features", "CPU part")
    return "\n".join(line for line in lines if line.split(":")[0].strip() in keep)


class ExecutableStore:
    """load(key) and save(key, compiled) under directory, for one engine configuration.

    `engine` names that configuration (jax/program_specs.py: ProgramSpecs.identity); it and
    build_identity() go into every entry's file name."""

    def __init__(self, directory: str, engine: str, build: str | None = None):
        if jax.config.jax_compilation_cache_dir:
            raise ValueError("JAX's persistent compilation cache is on: the executables it "
                             "loads do not serialize again; use it or a store")  # fmt: skip
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        prune(self.directory)
        self._prefix = hashlib.sha256(f"{build or build_identity()}\0{engine}".encode()).digest()
        # entries not run, by reason: "damaged" (checksum), "crashed" (a load died), "unloadable"
        self.rejected: Counter[str] = Counter()
        self._lock = threading.Lock()  # the warm-up loads on several threads

    def path(self, key: tuple) -> str:
        name = hashlib.sha256(self._prefix + repr(key).encode()).hexdigest()[:40]
        return os.path.join(self.directory, name + ".xla")

    def load(self, key: tuple) -> jax.stages.Compiled | None:
        """The stored executable for key, or None (never stored, or not trusted, or damaged,
        or its last load crashed: each of the last three removes the file)."""
        from jax.experimental import serialize_executable

        path = self.path(key)
        try:
            with open(path, "rb") as f:
                if not _trusted(os.fstat(f.fileno())):
                    log.warning("executable %s: not this user's own or writable by others: "
                                "ignored", path)  # fmt: skip
                    return None
                blob = f.read()
            os.utime(path)  # in use: the last to be pruned
        except FileNotFoundError:
            return None
        payload = _verified(blob)
        if payload is None:
            self._reject(path, key, "damaged", "its checksum does not match")
            return None
        marker = _begin_load(path)
        if marker is None:
            self._reject(path, key, "crashed", "a previous load of it ended the process")
            return None
        try:
            data, in_tree, out_tree = pickle.loads(payload)
            return serialize_executable.deserialize_and_load(data, in_tree, out_tree)
        except Exception as exc:  # foreign: compile again, and replace it
            self._reject(path, key, "unloadable", f"it does not load ({exc})")
            return None
        finally:
            _end_load(path, marker)

    def _reject(self, path: str, key: tuple, reason: str, why: str) -> None:
        """An entry not to be run: removed, so that the program is compiled and stored again."""
        log.warning("executable %s for %s does not load: %s: removed, compiling it", path, key,
                    why)  # fmt: skip
        _remove(path)
        with self._lock:
            self.rejected[reason] += 1

    def save(self, key: tuple, compiled: jax.stages.Compiled) -> bool:
        """Store a freshly compiled executable; False when it cannot be serialized."""
        from jax.experimental import serialize_executable

        try:
            payload = pickle.dumps(serialize_executable.serialize(compiled))
        except (ValueError, NotImplementedError, TypeError, pickle.PicklingError) as exc:
            log.debug("program %s is not serializable (%s): compiled at each start", key, exc)
            return False
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, self.path(key))
        except OSError as exc:  # a full disk costs the next start a compile, nothing more
            log.warning("executable for %s not stored: %s", key, exc)
            _remove(tmp)
            return False
        return True


def prune(directory: str, keep_bytes: int = KEEP_BYTES) -> None:
    """Remove the least recently used entries while the store holds more than keep_bytes
    (each change to the engine's code makes a new set, and the old ones are never loaded)."""
    entries = []
    with os.scandir(directory) as it:
        for entry in it:
            try:
                if entry.name.endswith(".xla") and entry.is_file():
                    st = entry.stat()
                    entries.append((st.st_mtime, st.st_size, entry.path))
            except FileNotFoundError:  # another worker's prune removed it since the listing
                continue
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= keep_bytes:
            break
        _remove(path)
        total -= size


def _verified(blob: bytes) -> memoryview | None:
    """An entry's payload, or None when its header or checksum is wrong."""
    start = len(MAGIC) + DIGEST_BYTES
    if not blob.startswith(MAGIC) or len(blob) < start:
        return None
    payload = memoryview(blob)[start:]
    if hashlib.sha256(payload).digest() != blob[len(MAGIC) : start]:
        return None
    return payload


def _begin_load(path: str) -> int | None:
    """Hold path's crash marker, locked and holding this pid, for the length of a load: its
    descriptor, or None when a marker was left by a loader that died (the marker is removed)."""
    marker = path + LOADING
    while True:
        fd = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a live loader of the same entry: wait for its end
        try:
            current = os.stat(marker, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if not current:  # the loader we waited for finished and removed it: a fresh one
            os.close(fd)
            continue
        if os.fstat(fd).st_size:  # written, unlocked, still there: its loader died loading
            _remove(marker)
            os.close(fd)
            return None
        os.write(fd, f"{os.getpid()}\n".encode())
        _loading.add(marker)
        return fd


def _end_load(path: str, fd: int) -> None:
    """The load is over (it returned or raised): the marker goes, before its lock does, so
    that a loader waiting on it takes a fresh one."""
    _loading.discard(path + LOADING)
    _remove(path + LOADING)
    os.close(fd)


def abandon_loads() -> None:
    """This process exits on purpose in the middle of loads (a stop while starting: role_main
    exits at once): those loads did not end it, so their markers go and their entries stay."""
    for marker in list(_loading):
        _remove(marker)


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
