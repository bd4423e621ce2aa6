"""The engine's executable store (splitserve/engine/executables.py): a second engine of the same
configuration loads every program instead of compiling it, and computes exactly what a freshly
compiled one does; another configuration never meets those files; a torn, foreign or
others-writable file is never run; the store stays within its size bound."""

from __future__ import annotations

import logging
import os

import jax
import pytest

from splitserve.engine import executables
from splitserve.engine.interface import LogitsControls, SamplingParams
from splitserve.engine.jax_engine import build_jax_engine

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
    assert set(sources) == {"cache"} and sum(sources.values()) == len(second.program_keys())
    assert run(second) == reference
    fresh = engine(None)  # no store at all: the plain compile path
    assert set(warm(fresh)) == {"compiled, no cache"}
    assert run(fresh) == reference


def test_another_configuration_never_meets_these_files(tmp_path):
    store = str(tmp_path / "x")
    two, three = engine(store, num_slots=2), engine(store, num_slots=3)  # another cache shape
    key = ("insert", 16, 64)
    assert two._obtain(key)[1] == "compiled"
    assert two.executables.path(key) != three.executables.path(key)
    assert three.executables.load(key) is None and engine(store).executables.load(key)


def test_a_torn_or_untrusted_file_is_not_run(tmp_path, caplog):
    store = str(tmp_path / "x")
    e = engine(store)
    key, other = ("sample", 1, True), ("sample", 2, False)
    e._obtain(key), e._obtain(other)
    path = e.executables.path(key)
    with open(path, "r+b") as f:
        f.truncate(100)
    again = engine(store)
    with caplog.at_level(logging.WARNING, logger="splitserve.engine.executables"):
        assert again.executables.load(key) is None
    assert "does not load" in caplog.text and not os.path.exists(path)
    program, source = again._obtain(key)  # compiled again and stored whole
    assert source == "compiled" and os.path.getsize(path) > 100

    os.chmod(again.executables.path(other), 0o666)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="splitserve.engine.executables"):
        assert again.executables.load(other) is None
    assert "writable by others" in caplog.text


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
    for name in ("a.py", "b.so"):
        (fake_dir / name).write_text("one")
    monkeypatch.setattr(executables, "_ENGINE_DIR", str(fake_dir))
    one = executables.build_identity()
    (fake_dir / "a.py").write_text("two")
    assert len({before, one, executables.build_identity()}) == 3
