"""The programs compiled after warm-up (the JAX engine's deferred keys) end with their engine:
close() stops the compiles after the one in hand, leaving the rest to their stand-ins; one that
fails to compile keeps its stand-in; and a process that exits while one compiles exits cleanly
(a daemon thread killed inside an XLA compile used to abort it: C++ terminate, status 134)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from splitserve.engine.compile import background
from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine

pytestmark = pytest.mark.timeout(600)

# an engine with four 4-step programs to compile after warm-up (the script's too)
ARGS = ("random:test-tiny:9", 2, 128)
OPTIONS = {"prefill_buckets": (16, 128), "decode_buckets": (64, 128), "decode_steps": (4,)}


def test_close_stops_the_compiles_and_the_stand_ins_go_on():
    eng = build_jax_engine(*ARGS, **OPTIONS)
    eng.warmup(background=False)
    total = eng.multistep_pending
    assert total > 1
    thread = eng.programs.compile_in_background()
    eng.close()
    assert not thread.is_alive()
    assert eng.multistep_pending >= total - 1  # at most the program in hand was finished
    prefix = eng.prefill([5, 6, 7], SamplingParams())
    eng.insert(prefix, 0, SamplingParams())
    assert eng.generate_many(4).tokens.shape == (4, 2)  # a stand-in or the program: either runs


def test_a_program_that_fails_to_compile_keeps_its_stand_in():
    """A deferred program whose compile fails counts as done (nothing is left to wait for) but
    stays away from the request path: generate_many runs its stand-in and compiles nothing."""
    eng = build_jax_engine(*ARGS, **OPTIONS)
    eng.warmup(background=False)
    real = eng.programs.obtain

    def obtain(key):
        if key[0] == "decode" and key[3] > 1:
            raise RuntimeError(f"no compile for {key}")
        return real(key)

    # every later compile goes through it: the background's and a step's
    eng.programs.obtain = obtain
    eng.programs.compile_in_background().join()
    assert eng.multistep_pending == 0
    prefix = eng.prefill([5, 6, 7], SamplingParams())
    eng.insert(prefix, 0, SamplingParams())
    assert not eng.multi_step_ready(4)
    assert eng.generate_many(4).tokens.shape == (4, 2)  # single steps, no compile raised


def test_a_process_exiting_inside_a_background_compile_exits_cleanly():
    # the script's engine marks the moment its background thread hands a lowered program to
    # XLA's compiler (seconds of C++ on that thread), and the main thread exits then
    script = textwrap.dedent(f"""
        import sys, threading
        from splitserve.engine.jax.build import build_jax_engine
        eng = build_jax_engine(*{ARGS!r}, **{OPTIONS!r})
        eng.warmup(background=False)
        compiling = threading.Event()

        def obtain(key):
            fn, args = eng.specs.lowered(key)
            lowered = fn.lower(*args)
            compiling.set()
            return lowered.compile(), "compiled"

        eng.programs.obtain = obtain
        eng.programs.compile_in_background()
        assert compiling.wait(300), "no background compile started"
        sys.exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=500)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_process_exiting_while_a_background_program_traces_stops_it_first():
    """weakref.finalize's exit hook, which JAX's tracing registers after splitserve's import,
    drops the constants of a trace in flight (the compile then failed: a KeyError on a
    parameter's Var, logged at every such exit). The background compiles must be stopped
    before it runs. The script's background thread holds its program until the stop comes,
    so the thread is there at exit for sure; the hook says whether it still is when weakref's
    hook runs."""
    script = textwrap.dedent(f"""
        import threading, weakref
        plain_exit = weakref.finalize._exitfunc.__func__

        def exitfunc(cls):
            alive = sum(t.name == "compile-deferred" for t in threading.enumerate())
            print("background threads at weakref's exit hook:", alive, flush=True)
            plain_exit(cls)

        weakref.finalize._exitfunc = classmethod(exitfunc)  # before anything registers it
        from splitserve.engine.jax.build import build_jax_engine
        eng = build_jax_engine(*{ARGS!r}, **{OPTIONS!r})
        eng.warmup(background=False)
        real, in_hand = eng.programs.obtain, threading.Event()

        def obtain(key):
            in_hand.set()
            assert eng.programs._stop_background.wait(300), "never stopped"
            return real(key)

        eng.programs.obtain = obtain
        eng.programs.compile_in_background()
        assert in_hand.wait(300), "no background compile started"
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=500)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "background threads at weakref's exit hook: 0" in done.stdout, done.stdout
    assert "after warm-up failed" not in done.stderr, done.stderr[-3000:]


def test_the_compiles_wait_for_a_quiet_worker_and_keep_its_priority(monkeypatch):
    """Nothing compiles while quiet() says the worker is busy, however often it is asked; once
    it says idle (long enough), every program compiles, on a thread at the process's own CPU
    priority: a lowered one made it hold the GIL while the scheduler passed it over, and the
    worker's other threads (its heartbeats) waited behind it."""
    monkeypatch.setattr(background, "QUIET_BEFORE_COMPILE_S", 0.2)
    eng = build_jax_engine(*ARGS, **OPTIONS)
    eng.warmup(background=False)
    total = eng.multistep_pending
    idle, polls_while_busy, busy_polls_seen = threading.Event(), threading.Event(), []
    compiles, priorities = [], []
    real = eng.programs.obtain

    def quiet() -> bool:
        if not idle.is_set():
            busy_polls_seen.append(len(compiles))
            if len(busy_polls_seen) >= 5:
                polls_while_busy.set()
        return idle.is_set()

    def obtain(key):
        priorities.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        compiles.append(key)
        return real(key)

    eng.programs.obtain = obtain
    thread = eng.programs.compile_in_background(quiet)
    assert polls_while_busy.wait(300), "quiet() was never asked"
    idle.set()
    thread.join(timeout=500)
    assert not thread.is_alive()
    assert busy_polls_seen and set(busy_polls_seen) == {0}  # nothing compiled while busy
    assert len(compiles) == total and eng.multistep_pending == 0
    assert set(priorities) == {os.getpriority(os.PRIO_PROCESS, 0)}


def test_close_stops_a_wait_for_quiet():
    eng = build_jax_engine(*ARGS, **OPTIONS)
    eng.warmup(background=False)
    total = eng.multistep_pending
    asked = threading.Event()

    def quiet() -> bool:
        asked.set()
        return False

    thread = eng.programs.compile_in_background(quiet)
    assert asked.wait(300)
    eng.close()
    assert not thread.is_alive()
    assert eng.multistep_pending == total  # nothing compiled: the stand-ins run
