"""JaxEngine: the Engine interface over the Llama math, with a slot-based KV cache.

1. `prefill` pads the prompt to a length bucket (one compiled program per bucket), runs it,
   samples output position 0, and returns the KV cache cut to the true length as numpy.
2. `insert` copies such a prefix (maybe a read-only view of a message buffer) into one
   slot of the device cache and records the slot's position, next input token and
   sampling parameters on the host. The cache is one buffer pair per layer (XLA on CPU
   copies slices of a stacked buffer before using them): keys [slots, kv_heads, head_dim,
   capacity] (transposed, so q.K reads along the last axis), values [slots, kv_heads,
   capacity, head_dim].
3. `generate` runs one compiled step over every slot: the cache buffers are donated so
   the new K/V are written in place. The cache's capacity (positions per slot) follows
   the smallest decode bucket that covers the longest live sequence, by a compiled copy,
   so attention costs what the live sequences need, not max_seq_len. It grows at once; it
   shrinks only once the live sequences have needed less for `shrink_after_steps` steps
   in a row: a copy of a large cache stalls a step for as long as several steps take, and
   under a steady load the longest sequence keeps ending and another soon takes its place.
   The step returns greedy picks directly; only when some live slot samples does a second,
   per-slot sampling program run on its logits.
4. `free` marks the slot unused; its stale cache is never visible to other slots (each
   slot attends to its own row only) nor to its next occupant (masked by position).

Every program is compiled ahead of time (`warmup`) and kept as an executable, so no step
ever pays a compile after the worker says Ready.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from splitserve.engine import llama_model
from splitserve.engine import sampling as sampler
from splitserve.engine.interface import Engine, Prefix, SamplingParams, StepOutput
from splitserve.engine.llama_config import LlamaConfig, preset

# Rows of the packed per-step int32 input (one host->device copy per step, not five).
_TOKEN, _POS, _OUT_POS, _TOP_K, _SEED = range(5)
# Rows of the packed per-step float32 input.
_TEMP, _TOP_P = range(2)


def length_buckets(smallest: int, largest: int) -> tuple[int, ...]:
    """Powers of two from `smallest` below `largest`, then `largest` itself."""
    out, n = [], smallest
    while n < largest:
        out.append(n)
        n *= 2
    out.append(largest)
    return tuple(out)


def capacity_buckets(smallest: int, largest: int) -> tuple[int, ...]:
    """Decode cache capacities: powers of two from `smallest` and, from 2 * smallest on,
    the midpoints 1.5x between them (64, 128, 192, 256, 384, ...), then `largest`.

    Attention is memory-bound and reads the whole capacity every step, so the finer steps
    waste at most a third of it instead of half, for a few more compiled programs.
    """
    out: list[int] = []
    n = smallest
    while n < largest:
        out.append(n)
        if n >= 2 * smallest and n * 3 // 2 < largest:
            out.append(n * 3 // 2)
        n *= 2
    out.append(largest)
    return tuple(out)


def _pick(buckets: Sequence[int], n: int) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"length {n} exceeds the largest bucket {buckets[-1]}")


def _prefill_fn(cfg, params, tokens, length):
    logits, k, v = llama_model.prefill(cfg, params, tokens, length)
    return logits[None], k, v  # logits [1, vocab]: the sampling program's row shape


def _sample_fn(greedy_only, logits, ints, floats):
    if greedy_only:
        return sampler.greedy(logits)
    seeds = jax.lax.bitcast_convert_type(ints[_SEED], jnp.uint32)
    return sampler.sample(
        logits, floats[_TEMP], ints[_TOP_K], floats[_TOP_P], seeds, ints[_OUT_POS]
    )


def _decode_fn(cfg, params, cache_k, cache_v, ints):
    """One step. Greedy picks are fused in (the common case needs nothing else); the logits
    come back too, for the separate sampling program when some slot samples."""
    logits, cache_k, cache_v = llama_model.decode(
        cfg, params, cache_k, cache_v, ints[_TOKEN], ints[_POS]
    )
    tokens, logprobs = sampler.greedy(logits)
    return cache_k, cache_v, tokens, logprobs, logits


def _insert_fn(ck, cv, k, v, slot):
    """One layer: k, v [width, kv_heads, head_dim] -> positions [0, width) of one slot.

    Per layer rather than all layers at once: the same small program serves every layer,
    so the (width, capacity) pairs cost little to compile even for deep models.
    ck: [slots, KV, D, capacity] (keys transposed); cv: [slots, KV, capacity, D].
    """
    kt = jnp.transpose(k, (1, 2, 0))[None]  # [1, KV, D, width]
    vt = jnp.transpose(v, (1, 0, 2))[None]  # [1, KV, width, D]
    ck = jax.lax.dynamic_update_slice(ck, kt.astype(ck.dtype), (slot, 0, 0, 0))
    cv = jax.lax.dynamic_update_slice(cv, vt.astype(cv.dtype), (slot, 0, 0, 0))
    return ck, cv


def _resize_fn(capacity, ck, cv):
    """One layer's caches copied to another capacity: positions beyond it are dropped (no
    live slot uses them), new positions are zero."""

    def fit(a, axis):
        keep = min(a.shape[axis], capacity)
        a = jax.lax.slice_in_dim(a, 0, keep, axis=axis)
        pad = [(0, 0, 0)] * a.ndim
        pad[axis] = (0, capacity - keep, 0)
        return jax.lax.pad(a, jnp.zeros((), a.dtype), pad)

    return fit(ck, 3), fit(cv, 2)


class JaxEngine(Engine):
    """Llama in JAX behind the Engine interface (see the module docstring)."""

    def __init__(
        self,
        cfg: LlamaConfig,
        weights: dict[str, np.ndarray],
        num_slots: int,
        max_seq_len: int,
        *,
        prefill_buckets: Sequence[int] | None = None,
        decode_buckets: Sequence[int] | None = None,
        param_dtype=jnp.float32,
        cache_dtype=jnp.float32,
        shrink_after_steps: int = 256,
    ):
        if num_slots < 1 or max_seq_len < 2:
            raise ValueError(
                f"need num_slots >= 1 and max_seq_len >= 2, got {num_slots}, {max_seq_len}"
            )
        self.cfg = cfg
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.vocab_size = cfg.vocab_size
        self.cache_dtype = np.dtype(cache_dtype)
        self.prefill_buckets = tuple(prefill_buckets or length_buckets(16, max_seq_len))
        self.decode_buckets = tuple(decode_buckets or capacity_buckets(64, max_seq_len))
        for name, b in (("prefill", self.prefill_buckets), ("decode", self.decode_buckets)):
            if list(b) != sorted(set(b)) or b[-1] != max_seq_len:
                raise ValueError(f"{name} buckets {b} must ascend and end at {max_seq_len}")
        self.params = llama_model.prepare_params(cfg, weights, param_dtype)
        self._capacity = self.decode_buckets[0]
        self.shrink_after_steps = shrink_after_steps
        self._steps_over = 0  # consecutive steps whose live sequences needed a smaller cache
        self._cache_k, self._cache_v = self._empty_cache(self._capacity)
        # Host-side slot table, packed into one int and one float array per step.
        self._ints = np.zeros((5, num_slots), np.int32)  # rows: _TOKEN, _POS, ...
        self._floats = np.zeros((2, num_slots), np.float32)  # rows: _TEMP, _TOP_P
        self._floats[_TOP_P] = 1.0
        self._live = np.zeros(num_slots, bool)
        self._programs: dict[tuple, jax.stages.Compiled] = {}

    def _cache_shapes(self, capacity: int) -> tuple[tuple, tuple]:
        c = self.cfg
        k = (self.num_slots, c.kv_heads, c.head_dim, capacity)  # keys transposed
        v = (self.num_slots, c.kv_heads, capacity, c.head_dim)
        return k, v

    def _empty_cache(self, capacity: int) -> tuple[list, list]:
        k, v = self._cache_shapes(capacity)
        layers = range(self.cfg.layers)
        dt = self.cache_dtype
        return [jnp.zeros(k, dt) for _ in layers], [jnp.zeros(v, dt) for _ in layers]

    # -- compilation -------------------------------------------------------------------

    def _program(self, key: tuple):
        """The compiled executable for one shape, compiled on first use."""
        prog = self._programs.get(key)
        if prog is None:
            prog = self._compile(key)
            self._programs[key] = prog
        return prog

    def _cache_specs(self, capacity: int) -> tuple[list, list]:
        k, v = self._cache_shapes(capacity)
        spec = jax.ShapeDtypeStruct
        n = self.cfg.layers
        return [spec(k, self.cache_dtype)] * n, [spec(v, self.cache_dtype)] * n

    def _compile(self, key: tuple):
        cfg, s = self.cfg, self.num_slots
        i32, f32 = jnp.int32, jnp.float32
        spec = jax.ShapeDtypeStruct
        kind = key[0]
        if kind == "prefill":  # ("prefill", padded length)
            fn = jax.jit(partial(_prefill_fn, cfg))
            return fn.lower(self.params, spec((key[1],), i32), spec((), i32)).compile()
        if kind == "sample":  # ("sample", rows, greedy only)
            rows = key[1]
            fn = jax.jit(partial(_sample_fn, key[2]))
            args = spec((rows, cfg.vocab_size), f32), spec((5, rows), i32), spec((2, rows), f32)
            return fn.lower(*args).compile()
        if kind == "insert":  # ("insert", width, capacity), one layer
            part = spec((key[1], cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            ck, cv = (x[0] for x in self._cache_specs(key[2]))
            fn = jax.jit(_insert_fn, donate_argnums=(0, 1))
            return fn.lower(ck, cv, part, part, spec((), i32)).compile()
        if kind == "resize":  # ("resize", from capacity, to capacity), one layer
            ck, cv = (x[0] for x in self._cache_specs(key[1]))
            return jax.jit(partial(_resize_fn, key[2])).lower(ck, cv).compile()
        if kind == "decode":  # ("decode", capacity)
            fn = jax.jit(partial(_decode_fn, cfg), donate_argnums=(1, 2))
            return fn.lower(self.params, *self._cache_specs(key[1]), spec((5, s), i32)).compile()
        raise KeyError(key)

    def program_keys(self, prefill: bool = True, decode: bool = True) -> list[tuple]:
        """Every shape this engine runs (the prefill side, the decode side, or both)."""
        keys: list[tuple] = []
        if prefill:  # prefill samples one row, greedy or not
            keys += [("sample", 1, True), ("sample", 1, False)]
            keys += [("prefill", p) for p in self.prefill_buckets]
        if decode:  # decode samples every row when some slot is not greedy
            keys.append(("sample", self.num_slots, False))
            for i, c in enumerate(self.decode_buckets):
                keys.append(("decode", c))
                widths = sorted({min(p, c) for p in self.prefill_buckets})
                keys += [("insert", w, c) for w in widths]
                if i > 0:
                    prev = self.decode_buckets[i - 1]
                    keys += [("resize", prev, c), ("resize", c, prev)]
        return keys

    def warmup(
        self, prefill: bool = True, decode: bool = True, threads: int | None = None,
        progress: Callable[[tuple, int, int, float], None] | None = None,
    ):  # fmt: skip
        """Compile every program before the worker says Ready. A prefill worker needs only
        the prefill side (prefill=True, decode=False), a decode worker only the decode side.

        XLA compiles without holding the GIL, so a few threads cut the wall time of a
        warm-up (or of loading it from the persistent compilation cache).
        progress(key, done, total, seconds) is called as each program is ready, on the thread
        that compiled it (so that JAX's compilation-cache events seen there are that program's).
        """
        todo = [k for k in self.program_keys(prefill, decode) if k not in self._programs]
        threads = threads or min(4, os.cpu_count() or 1)
        done = itertools.count(1)  # next() is atomic: the compile threads share it

        def compile_one(key: tuple):
            start = time.perf_counter()
            program = self._compile(key)
            if progress is not None:
                progress(key, next(done), len(todo), time.perf_counter() - start)
            return program

        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="compile") as pool:
            for key, program in zip(todo, pool.map(compile_one, todo), strict=True):
                self._programs[key] = program

    # -- Engine interface --------------------------------------------------------------

    def prefill(self, tokens: Sequence[int], sampling: SamplingParams, out_pos: int = 0) -> Prefix:
        n = len(tokens)
        if not 1 <= n <= self.max_seq_len:
            raise ValueError(f"prompt of {n} tokens; this engine takes 1..{self.max_seq_len}")
        ids = np.asarray(tokens, np.int64)
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"token id outside the vocabulary [0, {self.vocab_size})")
        ints, floats = self._sampling_rows(sampling, out_pos=out_pos)
        bucket = _pick(self.prefill_buckets, n)
        padded = np.zeros(bucket, np.int32)
        padded[:n] = ids
        logits, k, v = self._program(("prefill", bucket))(self.params, padded, np.int32(n))
        greedy_only = sampling.temperature <= 0
        tok, lp = self._program(("sample", 1, greedy_only))(logits, ints, floats)
        k_np = np.asarray(k)  # [layers, bucket, kv_heads, head_dim]
        v_np = np.asarray(v)
        return Prefix(
            kv=[
                np.ascontiguousarray(k_np[:, :n], self.cache_dtype),
                np.ascontiguousarray(v_np[:, :n], self.cache_dtype),
            ],
            length=n,
            first_token=int(np.asarray(tok)[0]),
            first_logprob=float(np.asarray(lp)[0]),
            out_pos=out_pos,
        )

    def insert(self, prefix: Prefix, slot: int, sampling: SamplingParams) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} outside 0..{self.num_slots - 1}")
        n = prefix.length
        if not 1 <= n <= self.max_seq_len:
            raise ValueError(f"prefix of {n} tokens; this engine holds 1..{self.max_seq_len}")
        cfg = self.cfg
        want = (cfg.layers, n, cfg.kv_heads, cfg.head_dim)
        for arr in prefix.kv:
            if tuple(arr.shape) != want:
                raise ValueError(f"prefix kv shape {arr.shape}, expected {want}")
        ints, floats = self._sampling_rows(sampling, out_pos=prefix.out_pos + 1)
        # Room for the prefix and the first decoded token's K/V.
        need = _pick(self.decode_buckets, min(n + 1, self.max_seq_len))
        self._fit_capacity(max(self._capacity, need))
        width = min(_pick(self.prefill_buckets, n), self._capacity)
        padded = []
        for arr in prefix.kv:
            out = np.zeros((cfg.layers, width, cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            out[:, :n] = arr  # copies (and converts) even a read-only frombuffer view
            padded.append(out)
        program = self._program(("insert", width, self._capacity))
        slot_arg = np.int32(slot)
        for layer in range(cfg.layers):
            self._cache_k[layer], self._cache_v[layer] = program(
                self._cache_k[layer], self._cache_v[layer], padded[0][layer], padded[1][layer],
                slot_arg,
            )
        self._ints[:, slot] = ints[:, 0]
        self._ints[_TOKEN, slot] = prefix.first_token
        self._ints[_POS, slot] = n
        self._floats[:, slot] = floats[:, 0]
        self._live[slot] = True

    def kv_layout(self, length: int) -> list[tuple[np.dtype, tuple[int, ...]]]:
        cfg = self.cfg  # k and v: [layers, length, kv_heads, head_dim] each
        return [(self.cache_dtype, (cfg.layers, length, cfg.kv_heads, cfg.head_dim))] * 2

    def generate(self) -> StepOutput:
        live = self._live
        pos = self._ints[_POS]
        # A slot at max_seq_len has no room left: callers stop it before; clamping keeps
        # its writes inside its own row if one does not.
        np.minimum(pos, self.max_seq_len - 1, out=pos)
        if live.any():
            self._follow_need(_pick(self.decode_buckets, int(pos[live].max()) + 1))
        # Free slots write junk at position 0 of their own row, always inside capacity.
        pos[~live] = 0
        program = self._program(("decode", self._capacity))
        self._cache_k, self._cache_v, tokens, logprobs, logits = program(
            self.params, self._cache_k, self._cache_v, self._ints
        )
        if (self._floats[_TEMP][live] > 0).any():
            program = self._program(("sample", self.num_slots, False))
            tokens, logprobs = program(logits, self._ints, self._floats)
        tokens = np.asarray(tokens)
        logprobs = np.asarray(logprobs)
        self._ints[_TOKEN, live] = tokens[live]
        pos[live] += 1
        self._ints[_OUT_POS, live] += 1
        return StepOutput(tokens=tokens, logprobs=logprobs)

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} outside 0..{self.num_slots - 1}")
        self._live[slot] = False
        self._ints[:, slot] = 0
        self._floats[:, slot] = (0.0, 1.0)  # greedy, so it never forces the sampling variant

    # -- helpers -----------------------------------------------------------------------

    def _follow_need(self, need: int) -> None:
        """Grow to `need` now; shrink to it only after it has held for shrink_after_steps."""
        if need >= self._capacity:
            self._steps_over = 0
            self._fit_capacity(need)
            return
        self._steps_over += 1
        if self._steps_over >= self.shrink_after_steps:
            self._steps_over = 0
            self._fit_capacity(need)

    def _fit_capacity(self, target: int) -> None:
        """Grow or shrink the cache one bucket at a time until its capacity is `target`."""
        while self._capacity != target:
            i = self.decode_buckets.index(self._capacity)
            nxt = self.decode_buckets[i + 1 if target > self._capacity else i - 1]
            program = self._program(("resize", self._capacity, nxt))
            resized = [program(k, v) for k, v in zip(self._cache_k, self._cache_v, strict=True)]
            self._cache_k = [k for k, _ in resized]
            self._cache_v = [v for _, v in resized]
            self._capacity = nxt

    @staticmethod
    def _sampling_rows(sp: SamplingParams, out_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """One slot's packed sampling inputs: ints [5, 1], floats [2, 1]."""
        if sp.temperature < 0 or not 0.0 < sp.top_p <= 1.0 or sp.top_k < 0:
            raise ValueError(f"invalid sampling parameters {sp}")
        ints = np.zeros((5, 1), np.int32)
        ints[_OUT_POS] = out_pos
        ints[_TOP_K] = sp.top_k
        ints[_SEED] = np.uint32(sp.seed & 0xFFFFFFFF).view(np.int32)
        floats = np.array([[sp.temperature], [sp.top_p]], np.float32)
        return ints, floats


def load_model(model: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """`random:<preset>[:<seed>]`, a .gguf file, or a Hugging Face folder."""
    if model.startswith("random:"):
        from splitserve.engine.weights_random import random_weights

        parts = model.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"expected random:<preset>[:<seed>], got {model!r}")
        cfg = preset(parts[1])
        return cfg, random_weights(cfg, int(parts[2]) if len(parts) == 3 else 0)
    if os.path.isdir(model):
        from splitserve.engine.weights_hf import load_hf

        return load_hf(model)
    if os.path.isfile(model):
        from splitserve.engine.weights_gguf import load_gguf

        return load_gguf(model)
    raise FileNotFoundError(f"model {model!r}: not random:<preset>, a file, or a folder")


def build_jax_engine(model: str, num_slots: int, max_seq_len: int, **options) -> JaxEngine:
    """The factory worker processes call; `options` go to JaxEngine (buckets, dtypes)."""
    cfg, weights = load_model(model)
    return JaxEngine(cfg, weights, num_slots, max_seq_len, **options)
