"""JaxEngine's compiled programs, as a mixin: one executable per shape key, the keys a worker
warms up, and where each executable comes from.

1. `program_keys` lists every shape a prefill or a decode worker runs (batch, capacity and
   length buckets; see engine.py for what each program does).
2. `warmup` obtains them before the worker says Ready, on a few threads (XLA compiles
   and loads without holding the GIL), reporting each one (which, n of N, from where). The
   `deferred_keys` (each has a stand-in: a prefix-cache continuation runs the whole prompt, a
   k-step decode program k single steps) are loaded then only when the store has them; the
   others compile after Ready on a background thread (`compile_in_background`), each once the
   worker has been idle a moment, and until one is there the stand-in runs: the same tokens,
   only slower. On a cold start the 4-step decode programs were over half of the default
   model's decode warm-up.
3. `_obtain` loads a key's executable from the engine's ExecutableStore when it has one
   (compile/executables.py: no trace, no lowering), else lowers and compiles it from `_lowered`'s
   function and argument specs, with its kind's XLA options (compile/xla_options.py), and stores it
   for the next start.
4. `_program` is the lookup every call makes; a key missing there (one the warm-up does not
   cover, such as a prompt-logprobs length) is obtained on first use.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import jax
import jax.numpy as jnp

from splitserve.engine.compile.xla_options import compile_options
from splitserve.engine.interface import MAX_BAD_WORDS, MAX_LOGIT_BIAS
from splitserve.engine.jax import controls as ctl
from splitserve.engine.jax import programs as prog
from splitserve.engine.model.prefill_continue import prefill_continue_fn

log = logging.getLogger(__name__)

# This process's background compiles, each (stop event, thread): a daemon thread killed inside
# an XLA compile at interpreter exit aborts the process (C++ terminate, exit status 134), so at
# exit each is stopped after the program it is compiling. The hook must run before JAX's own
# exit handlers and before weakref.finalize's, which JAX's tracing registers later than this
# module's import and which drops the constants of a trace in flight (the compile then failed
# with a KeyError on a parameter's Var): compile_in_background registers it again, last.
_running: set[tuple[threading.Event, threading.Thread]] = set()


@atexit.register
def _stop_background_compiles() -> None:
    for stop, _ in list(_running):
        stop.set()
    for _, thread in list(_running):
        thread.join()

# How long the worker must have been idle before a deferred program starts compiling (seconds
# of a core each): a request that comes meanwhile shares the CPU with that one compile only.
QUIET_BEFORE_COMPILE_S = 1.0
QUIET_POLL_S = 0.1


def wait_for_quiet(quiet: Callable[[], bool] | None, stop: threading.Event) -> bool:
    """Wait until quiet() has been true for QUIET_BEFORE_COMPILE_S; False once stop is set."""
    if quiet is None:
        return not stop.is_set()
    since = None
    while not stop.is_set():
        now = time.monotonic()
        if not quiet():
            since = None
        elif since is None:
            since = now
        elif now - since >= QUIET_BEFORE_COMPILE_S:
            return True
        stop.wait(QUIET_POLL_S)
    return False


# How an executable came to be, as the start-up log says it (splitserve/startup_log.py).
FROM_STORE, COMPILED, NO_STORE = "cache", "compiled", "compiled, no cache"


class CompiledPrograms:
    """Mixed into JaxEngine; uses its cfg, params, buckets and cache shapes. `executables`
    (an ExecutableStore, or None) is set by the engine's constructor."""

    executables = None
    # deferred programs the background thread has still to obtain, by kind ("prefill_cont",
    # "decode"); a lookup never waits for one, their stand-ins run meanwhile
    _deferred: frozenset = frozenset()
    _handed: frozenset = frozenset()  # every key given to the background (a failed one too)
    _later: tuple = ()  # those warm-up left for compile_in_background, in its order
    background: threading.Thread | None = None
    _stop_background: threading.Event | None = None

    def program_identity(self) -> str:
        """Everything besides a program's key that shapes its executable: the model's
        configuration, the slots, the dtypes, the formats and the parameters' tree."""
        leaves = lambda tree: [(tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(tree)]  # noqa: E731
        trees = list({id(t): t for t in [*self._decode_params_at.values(), self.params]}.values())
        return repr((self.cfg, self.num_slots, str(self.cache_dtype), self.attention,
                     self.prompt_attention, self.weight_format, self.prefill_weight_format,
                     [(jax.tree.structure(t), leaves(t)) for t in trees]))  # fmt: skip

    def _program(self, key: tuple):
        """The executable for one shape, obtained on first use."""
        program = self._programs.get(key)
        if program is None:
            program = self._obtain(key)[0]
            self._programs[key] = program
        return program

    def _obtain(self, key: tuple) -> tuple[jax.stages.Compiled, str]:
        """(executable, where it came from): the store, or a compile (then stored)."""
        store = self.executables
        if store is not None:
            program = store.load(key)
            if program is not None:
                return program, FROM_STORE
        fn, args = self._lowered(key)
        program = fn.lower(*args).compile(compiler_options=compile_options(key[0]))
        if store is None:
            return program, NO_STORE
        store.save(key, program)
        return program, COMPILED

    def _cache_specs(self, capacity: int) -> tuple[list, list]:
        k, v = self._cache_shapes(capacity)
        spec = jax.ShapeDtypeStruct
        n = self.cfg.layers
        return [spec(k, self.cache_dtype)] * n, [spec(v, self.cache_dtype)] * n

    def _lowered(self, key: tuple) -> tuple[Callable, list]:
        """The jitted function of a key and the arguments (specs) it is lowered with."""
        cfg = self.cfg
        i32, f32 = jnp.int32, jnp.float32
        spec = jax.ShapeDtypeStruct
        kind = key[0]
        if kind == "prefill":  # ("prefill", count, padded length)
            fn = jax.jit(partial(prog.prefill_fn, cfg, self.prompt_attention))
            return fn, [self.params, spec((key[1], key[2]), i32), spec((key[1],), i32)]
        if kind == "sample":  # ("sample", rows, greedy only)
            rows = key[1]
            fn = jax.jit(partial(prog.sample_fn, key[2]))
            return fn, [spec((rows, cfg.vocab_size), f32), spec((prog.INT_ROWS, rows), i32),
                        spec((prog.FLOAT_ROWS, rows), f32)]  # fmt: skip
        if kind == "controls":  # ("controls", rows, with penalty history)
            rows, vocab = key[1], cfg.vocab_size
            args = [spec((rows, vocab), f32), spec((prog.INT_ROWS, rows), i32),
                    spec((prog.FLOAT_ROWS, rows), f32), spec((ctl.CF_ROWS, rows), f32),
                    spec((ctl.FLAG_ROWS, rows), i32), spec((rows, -(-vocab // 32)), i32),
                    spec((rows, MAX_LOGIT_BIAS), i32), spec((rows, MAX_LOGIT_BIAS), f32),
                    spec((rows, MAX_BAD_WORDS), i32)]
            if key[2]:
                args.append(spec((rows, vocab), i32))
            return jax.jit(prog.controls_fn), args
        if kind == "gather":  # ("gather", batch, rows): the controlled rows' logits
            return jax.jit(prog.gather_fn), [spec((key[1], cfg.vocab_size), f32),
                                             spec((key[2],), i32)]  # fmt: skip
        if kind == "prompt":  # ("prompt", padded length): prompt logprobs
            return jax.jit(partial(prog.prompt_fn, cfg)), [self.params, spec((key[1],), i32)]
        if kind == "insert":  # ("insert", width, capacity), one layer
            part = spec((key[1], cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            ck, cv = (x[0] for x in self._cache_specs(key[2]))
            fn = jax.jit(prog.insert_fn, donate_argnums=(0, 1))
            return fn, [ck, cv, part, part, spec((), i32)]
        if kind == "resize":  # ("resize", from capacity, to capacity), one layer
            ck, cv = (x[0] for x in self._cache_specs(key[1]))
            return jax.jit(partial(prog.resize_fn, key[2])), [ck, cv]
        if kind == "move":  # ("move", capacity), every layer
            fn = jax.jit(prog.move_fn, donate_argnums=(0, 1))
            return fn, [*self._cache_specs(key[1]), spec((), i32), spec((), i32)]
        if kind == "decode":  # ("decode", batch, capacity, steps)
            _, batch, capacity, steps = key
            args = [self._decode_params_at[batch], *self._cache_specs(capacity),
                    spec((prog.INT_ROWS, batch), i32)]
            if steps > 1:
                args.append(spec((prog.FLOAT_ROWS, batch), f32))
            return prog.jit_decode(cfg, steps, self.attention), args
        if kind == "prefill_cont":  # ("prefill_cont", cached bucket, new bucket): prefix_reuse.py
            _, c, t = key
            kv = spec((cfg.layers, c, cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            fn = jax.jit(partial(prefill_continue_fn, cfg))
            return fn, [self.params, kv, kv, spec((), i32), spec((t,), i32), spec((), i32)]
        raise KeyError(key)

    def program_keys(self, prefill: bool = True, decode: bool = True) -> list[tuple]:
        """Every shape this engine runs (the prefill side, the decode side, or both)."""
        keys: list[tuple] = []
        if prefill:  # prefill samples one row per prompt, greedy or not
            keys += [("sample", c, g) for c in self.shapes.prefill_counts for g in (True, False)]
            keys += [("prefill", c, t) for c, t in self.shapes.prefill_shapes]
            # a prompt with controls or a first-token mask (prompt logprobs, rare and one
            # program per length, compile on first use)
            keys += [("controls", 1, h) for h in (False, True)]
            # (the prefix cache's continuation programs are deferred_keys: prefix_reuse.py)
        if decode:  # decode samples every row of the batch when some row is not greedy
            sh = self.shapes
            keys += [("sample", b, False) for b in sh.batch_buckets]
            keys += [("controls", n, h) for n in sh.control_counts for h in (False, True)]
            keys += [("gather", b, n) for b in sh.batch_buckets for n in sh.control_counts
                     if n <= b]  # fmt: skip
            for i, c in enumerate(sh.decode_buckets):
                keys += [("decode", b, c, k) for b in sh.batch_buckets
                         for k in sh.decode_steps if k == 1 or b <= sh.chunk_batch]
                widths = sorted({min(p, c) for p in self.shapes.prefill_buckets})
                keys += [("insert", w, c) for w in widths]
                if len(self.shapes.batch_buckets) > 1:
                    keys.append(("move", c))
                if i > 0:
                    prev = self.shapes.decode_buckets[i - 1]
                    keys += [("resize", prev, c), ("resize", c, prev)]
        return list(dict.fromkeys(keys))

    def deferred_keys(self, prefill: bool = True, decode: bool = True) -> list[tuple]:
        """The programs that may arrive after Ready because each has a stand-in meanwhile:
        the prefix cache's continuations (one per (cached, new) bucket pair; a prompt runs
        whole instead) and the k-step decode programs (k single steps instead)."""
        keys = self.continue_keys() if prefill else []
        if decode:
            keys += [k for k in self.program_keys(False, True) if k[0] == "decode" and k[3] > 1]
        return keys

    def deferred_pending(self, kind: str) -> int:
        """How many deferred programs of one kind ("prefill_cont", "decode") are not here yet
        (the workers' load reports say it; benchmarks wait for 0)."""
        return sum(1 for key in self._deferred if key[0] == kind)

    def deferred(self, key: tuple) -> bool:
        """Whether key was left to the background and is not here (still compiling, or it
        failed to): its stand-in runs, and no request's path ever compiles it."""
        return key in self._handed and key not in self._programs

    def warmup(
        self, prefill: bool = True, decode: bool = True, threads: int | None = None,
        progress: Callable[..., None] | None = None, background: bool = True,
        quiet: Callable[[], bool] | None = None,
    ):  # fmt: skip
        """Obtain every program but the deferred ones before the worker says Ready (those the
        store has are loaded too; the rest compile in the background, from here, or when
        compile_in_background() is called if background is False). A prefill worker needs
        only the prefill side (prefill=True, decode=False), a decode worker only the decode
        side.

        progress(key, done, total, seconds, source) is called as each program is ready, on
        the thread that obtained it; source is FROM_STORE, COMPILED or NO_STORE. quiet: see
        compile_in_background.
        """
        later = [k for k in self.deferred_keys(prefill, decode) if k not in self._programs]
        skip = set(later) | set(self._programs)
        todo = [k for k in self.program_keys(prefill, decode) if k not in skip]
        threads = threads or min(4, os.cpu_count() or 1)
        done = itertools.count(1)  # next() is atomic: the compile threads share it

        def obtain(key: tuple):
            start = time.perf_counter()
            program, source = self._obtain(key)
            if progress is not None:
                progress(key, next(done), len(todo), time.perf_counter() - start, source)
            return program

        store = self.executables
        stored = store.load if store is not None else (lambda key: None)
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="compile") as pool:
            for key, program in zip(todo, pool.map(obtain, todo), strict=True):
                self._programs[key] = program
            for key, program in zip(later, pool.map(stored, later), strict=True):
                if program is not None:
                    self._programs[key] = program
        if store is not None and store.rejected:  # each was logged as it was met
            log.warning("stored executables not run and compiled again: %s",
                        dict(store.rejected))  # fmt: skip
        self._later = tuple(k for k in later if k not in self._programs)
        self._deferred = self._handed = frozenset(self._later)
        if background:
            self.compile_in_background(quiet)

    def compile_in_background(
        self, quiet: Callable[[], bool] | None = None
    ) -> threading.Thread | None:
        """Compile the deferred programs warm-up left one by one on a daemon thread; the
        programs dict takes each as it is ready, and a lookup never waits for one.

        quiet() (the worker's idle(); None: always) is what keeps the compiles off the requests'
        CPU: each program starts only once quiet() has held for QUIET_BEFORE_COMPILE_S. The
        thread keeps the process's CPU priority. It used to lower its own to nice 19, but
        tracing, lowering and parts of every compile hold the GIL, and a thread that holds it
        while the scheduler passes it over holds up every other thread of the worker: with two
        busy processes on two cores, a heartbeat thread's 0.25 s sleep ended up to 53 s late
        behind a nice-19 lowering and 1.9 s behind a nice-19 compile (0.015 s at nice 0), and
        the router declared a live decode worker dead eight times on a cold start."""
        keys, self._later = self._later, ()
        if not keys:
            return None
        stop = self._stop_background = threading.Event()
        # atexit runs the newest hook first: this one before weakref.finalize's (see _running)
        atexit.unregister(_stop_background_compiles)
        atexit.register(_stop_background_compiles)

        def run() -> None:
            for key in keys:
                if not wait_for_quiet(quiet, stop):  # close(): the rest stay deferred
                    return
                try:
                    self._programs[key] = self._obtain(key)[0]
                except Exception:  # a program that will not compile: its stand-in stays
                    log.exception("compiling %s after warm-up failed", key)
                self._deferred = self._deferred - {key}  # attempts left; only this thread writes
            log.info("%d programs compiled after warm-up", len(keys))

        def tracked() -> None:
            try:
                run()
            finally:
                _running.discard((stop, thread))

        thread = threading.Thread(target=tracked, name="compile-deferred", daemon=True)
        self.background = thread
        _running.add((stop, thread))
        thread.start()
        return thread

    def close(self) -> None:
        """Stop the background compiles after the program in hand (a stopping worker must
        not spend minutes of CPU on programs nobody will run, nor exit inside a compile)."""
        if self._stop_background is not None:
            self._stop_background.set()
        if self.background is not None:
            self.background.join()
