"""The engine's executable store (splitserve/engine/compile/executables.py): a second engine of the
same configuration loads every program instead of compiling it, and computes exactly what a
freshly compiled one does; another configuration never meets those files; a torn, foreign,
damaged or others-writable file is never run, nor one whose last load ended the process; the
store stays within its size bound."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading

import jax
import pytest

from splitserve.engine.compile import executables
from splitserve.engine.interface import LogitsControls, SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from tests.http_stack import wait_until

MODEL = "random:test-tiny:3"


def engine(store: str | None, num_slots: int = 2):
    return build_jax_engine(MODEL, num_slots, 64, prefill_buckets=(16, 64),
                            executable_dir=store)  # fmt: skip


def warm(e) -> dict[str, int]:
    sources: dict[str, int] = {}

    def progress(key, done, total, seconds, source):
        sources[source] = sources.get(source, 0) + 1

    e.warmup(progress=progress)
    return sources


def run(e) -> list:
    """Two streams (one greedy, one sampled with controls) through prefill and decode."""
    greedy, hot = SamplingParams(), SamplingParams(temperature=0.8, seed=7)
    a = e.prefill([1, 2, 3, 4, 5], greedy)
    b = e.prefill([9, 8, 7], hot)
    e.insert(a, 0, greedy)
    e.insert(b, 1, hot, controls=LogitsControls(bias_ids=[5], bias_values=[3.0]))
    out = [a.first_token, b.first_token, a.kv[0].sum()]
    for _ in range(12):
        step = e.generate()
        out += step.tokens.tolist() + step.logprobs.tolist()
    e.free(0)
    e.free(1)
    return out


def test_a_second_engine_loads_every_program_and_computes_the_same(tmp_path):
    store = str(tmp_path / "x")
    first = engine(store)
    assert set(warm(first)) == {"compiled"}
    reference = run(first)
    second = engine(store)
    sources = warm(second)
    assert set(sources) == {"cache"} and sum(sources.values()) == len(second.specs.keys())
    assert run(second) == reference
    fresh = engine(None)  # no store at all: the plain compile path
    assert set(warm(fresh)) == {"compiled, no cache"}
    assert run(fresh) == reference


def test_another_configuration_never_meets_these_files(tmp_path):
    store = str(tmp_path / "x")
    two, three = engine(store, num_slots=2), engine(store, num_slots=3)  # another cache shape
    key = ("insert", 16, 64)
    assert two.programs.obtain(key)[1] == "compiled"
    assert two.programs.store.path(key) != three.programs.store.path(key)
    assert three.programs.store.load(key) is None and engine(store).programs.store.load(key)


def test_a_torn_or_untrusted_file_is_not_run(tmp_path, caplog):
    store = str(tmp_path / "x")
    e = engine(store)
    key, other = ("sample", 1, True), ("sample", 2, False)
    e.programs.obtain(key), e.programs.obtain(other)
    path = e.programs.store.path(key)
    with open(path, "r+b") as f:
        f.truncate(100)
    again = engine(store)
    with caplog.at_level(logging.WARNING, logger="splitserve.engine.compile.executables"):
        assert again.programs.store.load(key) is None
    assert "does not load" in caplog.text and not os.path.exists(path)
    program, source = again.programs.obtain(key)  # compiled again and stored whole
    assert source == "compiled" and os.path.getsize(path) > 100

    os.chmod(again.programs.store.path(other), 0o666)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="splitserve.engine.compile.executables"):
        assert again.programs.store.load(other) is None
    assert "writable by others" in caplog.text


def test_a_flipped_byte_is_caught_before_loading_and_the_program_compiled_again(tmp_path):
    """A byte flipped in every stored executable (before, some such files loaded without an
    error and then aborted the worker in LLVM, at every start): none is deserialized, each is
    counted and compiled again, and the programs compute what they did."""
    store = str(tmp_path / "x")
    first = engine(store)
    warm(first)
    reference = run(first)
    entries = sorted(p for p in os.listdir(store) if p.endswith(".xla"))
    assert entries
    for name in entries:
        with open(os.path.join(store, name), "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0x10]))
    second = engine(store)
    assert warm(second) == {"compiled": len(second.specs.keys())}
    assert second.programs.store.rejected == {"damaged": len(entries)}
    assert run(second) == reference
    third = engine(store)  # stored whole again
    assert set(warm(third)) == {"cache"} and not third.programs.store.rejected


# A process that loads one stored executable and dies inside the load, as XLA's LLVM ended
# workers on a damaged file ("LLVM ERROR: invalid section index": an abort).
CRASHING_LOADER = """
import ast, os, sys
from jax.experimental import serialize_executable
from splitserve.engine.compile.executables import ExecutableStore
directory, identity_file, key = sys.argv[1:]
serialize_executable.deserialize_and_load = lambda *args: os.abort()
with open(identity_file) as f:
    ExecutableStore(directory, f.read()).load(ast.literal_eval(key))
"""


def test_a_load_that_ended_the_process_is_not_tried_again_from_that_file(tmp_path, caplog):
    store = str(tmp_path / "x")
    first = engine(store)
    key = ("sample", 1, True)
    assert first.programs.obtain(key)[1] == "compiled"
    identity = tmp_path / "identity"
    identity.write_text(first.specs.identity())
    child = subprocess.run([sys.executable, "-c", CRASHING_LOADER, store, str(identity),
                            repr(key)], capture_output=True, timeout=120)  # fmt: skip
    assert child.returncode == -signal.SIGABRT, child.stderr.decode()[-2000:]

    second = engine(store)
    with caplog.at_level(logging.WARNING, logger="splitserve.engine.compile.executables"):
        assert second.programs.obtain(key)[1] == "compiled"  # not loaded from the file that crashed
    assert second.programs.store.rejected == {"crashed": 1}
    assert "a previous load of it ended the process" in caplog.text
    assert not os.path.exists(second.programs.store.path(key) + executables.LOADING)
    assert engine(store).programs.obtain(key)[1] == "cache"  # the fresh file loads, and is kept


def _lock_waiters(path: str) -> int:
    """How many flock waiters /proc/locks shows blocked on path's inode."""
    inode = str(os.stat(path).st_ino)
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line and "FLOCK" in line
                   and line.split()[-3].rsplit(":", 1)[-1] == inode)  # fmt: skip


def test_a_marker_held_by_a_live_loader_is_waited_for_not_taken_for_a_crash(tmp_path):
    """Two workers of one configuration load the same entry at once: the second waits for the
    first's load, then loads the file itself (it is not removed as a crashed one)."""
    store = str(tmp_path / "x")
    e = engine(store)
    key = ("sample", 1, True)
    e.programs.obtain(key)
    path = e.programs.store.path(key)
    marker = path + executables.LOADING
    fd = os.open(marker, os.O_RDWR | os.O_CREAT, 0o600)  # as a live loader holds it
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"1\n")
    loaded: list = []
    other = threading.Thread(target=lambda: loaded.append(e.programs.store.load(key)))
    other.start()
    try:
        wait_until(lambda: _lock_waiters(marker) or loaded, 60, "the second loader to wait")
        assert not loaded, "a live loader's marker was taken for a crash"
    finally:
        os.unlink(marker)  # the first load ends as _end_load ends one
        os.close(fd)
        other.join(60)
    assert loaded and loaded[0] is not None
    assert not e.programs.store.rejected and os.path.exists(path)
    assert not os.path.exists(marker)


def test_a_stop_while_loading_leaves_no_crash_marker(tmp_path):
    """A worker stopped while it starts (Ctrl-C: role_main exits at once) was loading some
    programs: those loads did not crash it, and the next start loads them from the store."""
    store = str(tmp_path / "x")
    e = engine(store)
    key = ("sample", 1, True)
    e.programs.obtain(key)
    path = e.programs.store.path(key)
    fd = executables._begin_load(path)  # a load in flight, as the stop finds it
    assert os.path.exists(path + executables.LOADING)
    executables.abandon_loads()
    os.close(fd)  # the process exits
    assert not os.path.exists(path + executables.LOADING)
    assert engine(store).programs.obtain(key)[1] == "cache"


def test_the_store_refuses_to_sit_beside_jax_s_own_cache(tmp_path):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    try:
        with pytest.raises(ValueError, match="persistent compilation cache is on"):
            executables.ExecutableStore(str(tmp_path / "x"), "engine")
    finally:
        jax.config.update("jax_compilation_cache_dir", None)


def test_prune_keeps_the_most_recently_used(tmp_path):
    for i in range(5):
        path = tmp_path / f"{i}.xla"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + i, 1000 + i))
    (tmp_path / "other").write_bytes(b"y" * 5000)  # not an entry: never touched
    executables.prune(str(tmp_path), keep_bytes=2500)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.xla", "4.xla", "other"]


def test_prune_skips_an_entry_another_workers_prune_removed(tmp_path, monkeypatch):
    """Workers start together and each prunes the store: an entry listed here may be gone by
    the time it is looked at (a decode worker died of that FileNotFoundError at start)."""
    for i in range(3):
        path = tmp_path / f"{i}.xla"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + i, 1000 + i))
    listed = os.scandir

    class RemovedAfterListing:  # the listing, then another worker removes 0.xla
        def __enter__(self):
            entries = list(listed(tmp_path))
            os.remove(tmp_path / "0.xla")
            return iter(entries)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(executables.os, "scandir", lambda directory: RemovedAfterListing())
    executables.prune(str(tmp_path), keep_bytes=1500)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.xla"]


def test_build_identity_names_the_engine_code(monkeypatch, tmp_path):
    """An edited engine source file is another identity: its old executables are never run."""
    before = executables.build_identity()
    fake_dir = tmp_path / "engine"
    fake_dir.mkdir()
    (fake_dir / "model").mkdir()
    for name in ("a.py", "b.so", "model/c.py"):
        (fake_dir / name).write_text("one")
    monkeypatch.setattr(executables, "_ENGINE_DIR", str(fake_dir))
    one = executables.build_identity()
    (fake_dir / "a.py").write_text("two")
    two = executables.build_identity()
    (fake_dir / "model" / "c.py").write_text("two")  # a sub-package's file counts as well
    assert len({before, one, two, executables.build_identity()}) == 4
