"""Compiled programs kept on disk as serialized XLA executables, so that a restart loads each
one in a fraction of a second instead of tracing and lowering it again.

JAX's persistent compilation cache is keyed by the lowered program, so even a hit first traces
and lowers the function: about 0.7 s per decode step of the 30-layer default model on the
2-core benchmark machine (6 s under load), for each of a decode worker's 167 programs. This
store is keyed instead by what determines a program: its shape key, the engine's configuration
(the `engine` part of the key) and the build (`build_identity`: the JAX and jaxlib versions,
the CPU, XLA's flags, the engine's own source files and the native kernel). A change to any of
them is a different key, so a stale executable is never loaded.

An executable that JAX itself loaded from its persistent cache serializes without its machine
code (its first call then fails: "Function ... not found"), so an engine that keeps its programs
here compiles them with JAX's cache off (splitserve.engine.__init__ turns on one or the other).

Entries are written whole (a temporary name, then a rename), so concurrent workers and a crash
mid-write leave no torn file; they are read only when this user owns them and nobody else may
write them, because an executable is machine code the worker runs. A file that does not load
(truncated, or from another build that hashed the same) is removed and the program compiled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import platform
import stat
import tempfile

import jax

log = logging.getLogger(__name__)

FORMAT = "splitserve-executables-1"  # bump when the file layout changes
KEEP_BYTES = 2 << 30  # the store's size bound (the default model's programs take about 0.2 GiB)
_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__))


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
    # the engine's code (any .py of this package, and the native kernel it calls) shapes the
    # programs: an edited file must never meet an executable compiled from the old one
    for name in sorted(os.listdir(_ENGINE_DIR)):
        if name.endswith(".py") or name.endswith(".so"):
            with open(os.path.join(_ENGINE_DIR, name), "rb") as f:
                h.update(name.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


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

    `engine` names that configuration (JaxEngine.program_identity); it and build_identity()
    go into every entry's file name."""

    def __init__(self, directory: str, engine: str, build: str | None = None):
        if jax.config.jax_compilation_cache_dir:
            raise ValueError("JAX's persistent compilation cache is on: the executables it "
                             "loads do not serialize again; use it or a store")  # fmt: skip
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        prune(self.directory)
        self._prefix = hashlib.sha256(f"{build or build_identity()}\0{engine}".encode()).digest()

    def path(self, key: tuple) -> str:
        name = hashlib.sha256(self._prefix + repr(key).encode()).hexdigest()[:40]
        return os.path.join(self.directory, name + ".xla")

    def load(self, key: tuple) -> jax.stages.Compiled | None:
        """The stored executable for key, or None (never stored, or not trusted, or broken)."""
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
        try:
            payload, in_tree, out_tree = pickle.loads(blob)
            return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        except Exception as exc:  # torn or foreign: compile again, and replace it
            log.warning("executable %s for %s does not load (%s): compiling it", path, key, exc)
            _remove(path)
            return None

    def save(self, key: tuple, compiled: jax.stages.Compiled) -> bool:
        """Store a freshly compiled executable; False when it cannot be serialized."""
        from jax.experimental import serialize_executable

        try:
            blob = pickle.dumps(serialize_executable.serialize(compiled))
        except (ValueError, NotImplementedError, TypeError, pickle.PicklingError) as exc:
            log.debug("program %s is not serializable (%s): compiled at each start", key, exc)
            return False
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
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


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
