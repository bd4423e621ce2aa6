"""JaxEngine: the Engine interface over the Llama math, with a slot-based KV cache.

1. `prefill` pads the prompt to a length bucket (one compiled program per bucket), runs it,
   samples output position 0, and returns the KV cache cut to the true length as numpy.
   `prefill_batch` runs several prompts in one call, padded to a (count, length) bucket
   within a token budget, with the same results as one at a time.
2. `insert` copies such a prefix (maybe a read-only view of a message buffer) into the row
   of the batch that holds the slot (slot_rows.py: live slots stay packed at the front),
   and records the row's position, next input token and sampling parameters on the host.
   The cache is one buffer pair per layer (XLA on CPU copies slices of a stacked buffer
   before using them): keys [rows, kv_heads, head_dim, capacity] (transposed, so q.K reads
   along the last axis), values [rows, kv_heads, capacity, head_dim].
3. `generate` runs one compiled step over rows [0, b), b the smallest batch bucket that
   holds the live slots (a live row beyond b first moves into a hole below it), so one
   stream costs a batch of one, not num_slots. The cache buffers are donated so the new
   K/V are written in place. The cache's capacity (positions per row) follows the smallest
   capacity bucket that covers the longest live sequence, by a compiled copy, so attention
   costs what the live sequences need, not max_seq_len. It grows at once; it shrinks only
   once the live sequences have needed less for `shrink_after_steps` steps in a row: a copy
   of a large cache stalls a step for as long as several steps take, and under a steady
   load the longest sequence keeps ending and another soon takes its place. The step
   returns greedy picks directly; only when some live slot samples does a second, per-row
   sampling program run on its logits. `generate_many(k)` runs k steps in one dispatch.
   Logits controls and grammar masks (interface.py) run in a third program on the same
   logits, only while some live row has them (controls.py; per-row state on the host in
   control_rows.py): a batch without any runs exactly the programs above.
4. `free` marks the slot unused; its stale cache is never visible to other slots (each
   row attends to its own cache only) nor to its next occupant (masked by position).

Matrices take the form `weight_format` names (quant.WEIGHT_FORMATS): float32 for XLA, or a
quantized form for the native kernel; prefill may use another (`prefill_weight_format`).
"auto" (the default) keeps a GGUF file's own Q8_0/Q4_0/Q4_1 blocks (exact, and the fastest
measured) and float32 for any other checkpoint (int8 and bfloat16 round its weights: opt-in);
prefill defaults to float32.
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

from splitserve.engine import controls as ctl
from splitserve.engine import llama_model, qkernel
from splitserve.engine import programs as prog
from splitserve.engine.buckets import (
    batch_buckets,
    capacity_buckets,
    check_buckets,
    length_buckets,
    pick,
    prefill_shapes,
)
from splitserve.engine.control_rows import ControlRows
from splitserve.engine.interface import (
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    Engine,
    LogitsControls,
    Prefix,
    PromptLogprobs,
    SamplingParams,
    StepMasks,
    StepOutput,
    TopLogprobs,
)
from splitserve.engine.jax_prefix import PrefixReuse
from splitserve.engine.llama_config import LlamaConfig, preset
from splitserve.engine.slot_rows import SlotRows


class JaxEngine(PrefixReuse, Engine):
    """Llama in JAX behind the Engine interface (see the module docstring)."""

    supports_controls = True

    def __init__(
        self,
        cfg: LlamaConfig,
        weights: dict[str, np.ndarray],
        num_slots: int,
        max_seq_len: int,
        *,
        prefill_buckets: Sequence[int] | None = None,
        decode_buckets: Sequence[int] | None = None,
        batch_sizes: Sequence[int] | None = None,
        prefill_counts: Sequence[int] = (1,),
        prefill_batch_tokens: int = 1024,
        decode_steps: Sequence[int] = (1,),
        weight_format: str = "auto",
        prefill_weight_format: str | None = None,
        attention: str = "auto",
        native: dict | None = None,
        param_dtype=jnp.float32,
        cache_dtype=jnp.float32,
        shrink_after_steps: int = 256,
        prefix_reuse: bool = False,
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
        self.prefill_buckets = check_buckets(
            "prefill", prefill_buckets or length_buckets(16, max_seq_len), max_seq_len
        )
        self.decode_buckets = check_buckets(
            "decode", decode_buckets or capacity_buckets(64, max_seq_len), max_seq_len
        )
        self.batch_buckets = check_buckets(
            "batch", batch_sizes or batch_buckets(num_slots), num_slots
        )
        # How many controlled rows a decode step's controls program runs on (the count padded
        # up to one of these): 1, 2, 4, ... whatever the batch buckets, so one constrained
        # request among many plain ones costs a program over one row, not the batch.
        self.control_counts = tuple(sorted({*length_buckets(1, num_slots), *self.batch_buckets}))
        self.prefill_counts = tuple(sorted({1, *prefill_counts}))
        self.prefill_shapes = prefill_shapes(
            self.prefill_buckets, self.prefill_counts, prefill_batch_tokens
        )
        self.prefill_batch_tokens = prefill_batch_tokens
        self.decode_steps = tuple(sorted({1, *decode_steps}))
        if attention not in ("auto", "native", "xla"):
            raise ValueError(f"attention {attention!r}: auto, native or xla")
        if attention == "auto":
            attention = "native" if qkernel.available() else "xla"
        self.attention = attention
        if weight_format == "auto":  # a GGUF file's own blocks when it has them (exact)
            weight_format = "gguf" if native else "float32"
        # Prefill multiplies many rows at once, where XLA's float32 matmuls beat the kernel
        # (default model, 64 and 128 tokens: 2x less CPU time; 16 tokens: 0.7x).
        self.weight_format = weight_format
        self.prefill_weight_format = prefill_weight_format or "float32"
        self.decode_params = llama_model.prepare_params(
            cfg, weights, param_dtype, weights=weight_format, native=native
        )
        self.params = (  # the prefill side's
            self.decode_params
            if self.prefill_weight_format == weight_format
            else llama_model.prepare_params(
                cfg, weights, param_dtype, weights=self.prefill_weight_format, native=native
            )
        )
        self._capacity = self.decode_buckets[0]
        self.shrink_after_steps = shrink_after_steps
        self._steps_over = 0  # consecutive steps whose live sequences needed a smaller cache
        self._cache_k, self._cache_v = self._empty_cache(self._capacity)
        # Host-side table by row, packed into one int and one float array per step.
        self._rows = SlotRows(num_slots)
        self._ints = np.zeros((prog.INT_ROWS, num_slots), np.int32)  # TOKEN, POS, ...
        self._floats = np.zeros((prog.FLOAT_ROWS, num_slots), np.float32)  # TEMP, TOP_P
        self._floats[prog.TOP_P] = 1.0
        self._live = np.zeros(num_slots, bool)  # by row
        self._controls = ControlRows(num_slots, cfg.vocab_size)  # by row
        self._programs: dict[tuple, jax.stages.Compiled] = {}
        self.rows_moved = 0  # compaction moves so far (a figure for benchmarks)
        self.prefix_reuse = prefix_reuse  # warm-up compiles prefill_cached's programs too

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
        program = self._programs.get(key)
        if program is None:
            program = self._compile(key)
            self._programs[key] = program
        return program

    def _cache_specs(self, capacity: int) -> tuple[list, list]:
        k, v = self._cache_shapes(capacity)
        spec = jax.ShapeDtypeStruct
        n = self.cfg.layers
        return [spec(k, self.cache_dtype)] * n, [spec(v, self.cache_dtype)] * n

    def _compile(self, key: tuple):
        cfg = self.cfg
        i32, f32 = jnp.int32, jnp.float32
        spec = jax.ShapeDtypeStruct
        kind = key[0]
        if kind == "prefill":  # ("prefill", count, padded length)
            fn = jax.jit(partial(prog.prefill_fn, cfg))
            args = spec((key[1], key[2]), i32), spec((key[1],), i32)
            return fn.lower(self.params, *args).compile()
        if kind == "sample":  # ("sample", rows, greedy only)
            rows = key[1]
            fn = jax.jit(partial(prog.sample_fn, key[2]))
            args = (spec((rows, cfg.vocab_size), f32), spec((prog.INT_ROWS, rows), i32),
                    spec((prog.FLOAT_ROWS, rows), f32))
            return fn.lower(*args).compile()
        if kind == "controls":  # ("controls", rows, with penalty history)
            rows, vocab = key[1], cfg.vocab_size
            args = [spec((rows, vocab), f32), spec((prog.INT_ROWS, rows), i32),
                    spec((prog.FLOAT_ROWS, rows), f32), spec((ctl.CF_ROWS, rows), f32),
                    spec((ctl.FLAG_ROWS, rows), i32), spec((rows, -(-vocab // 32)), i32),
                    spec((rows, MAX_LOGIT_BIAS), i32), spec((rows, MAX_LOGIT_BIAS), f32),
                    spec((rows, MAX_BAD_WORDS), i32)]
            if key[2]:
                args.append(spec((rows, vocab), i32))
            return jax.jit(prog.controls_fn).lower(*args).compile()
        if kind == "gather":  # ("gather", batch, rows): the controlled rows' logits
            args = spec((key[1], cfg.vocab_size), f32), spec((key[2],), i32)
            return jax.jit(prog.gather_fn).lower(*args).compile()
        if kind == "prompt":  # ("prompt", padded length): prompt logprobs
            fn = jax.jit(partial(prog.prompt_fn, cfg))
            return fn.lower(self.params, spec((key[1],), i32)).compile()
        if kind == "insert":  # ("insert", width, capacity), one layer
            part = spec((key[1], cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            ck, cv = (x[0] for x in self._cache_specs(key[2]))
            fn = jax.jit(prog.insert_fn, donate_argnums=(0, 1))
            return fn.lower(ck, cv, part, part, spec((), i32)).compile()
        if kind == "resize":  # ("resize", from capacity, to capacity), one layer
            ck, cv = (x[0] for x in self._cache_specs(key[1]))
            return jax.jit(partial(prog.resize_fn, key[2])).lower(ck, cv).compile()
        if kind == "move":  # ("move", capacity), every layer
            fn = jax.jit(prog.move_fn, donate_argnums=(0, 1))
            return fn.lower(*self._cache_specs(key[1]), spec((), i32), spec((), i32)).compile()
        if kind == "decode":  # ("decode", batch, capacity, steps)
            _, batch, capacity, steps = key
            args = [self.decode_params, *self._cache_specs(capacity),
                    spec((prog.INT_ROWS, batch), i32)]
            if steps > 1:
                args.append(spec((prog.FLOAT_ROWS, batch), f32))
            return prog.jit_decode(cfg, steps, self.attention).lower(*args).compile()
        if kind == "prefill_cont":  # ("prefill_cont", cached bucket, new bucket)
            return self.compile_continue(key)
        raise KeyError(key)

    def program_keys(self, prefill: bool = True, decode: bool = True) -> list[tuple]:
        """Every shape this engine runs (the prefill side, the decode side, or both)."""
        keys: list[tuple] = []
        if prefill:  # prefill samples one row per prompt, greedy or not
            keys += [("sample", c, g) for c in self.prefill_counts for g in (True, False)]
            keys += [("prefill", c, t) for c, t in self.prefill_shapes]
            # a prompt with controls or a first-token mask (prompt logprobs, rare and one
            # program per length, compile on first use)
            keys += [("controls", 1, h) for h in (False, True)]
            # the prefix cache's continuation programs compile after warm-up, in the background
            # (jax_prefix.py): one per (cached, new) bucket pair, too many to hold Ready for
        if decode:  # decode samples every row of the batch when some row is not greedy
            keys += [("sample", b, False) for b in self.batch_buckets]
            keys += [("controls", n, h) for n in self.control_counts for h in (False, True)]
            keys += [("gather", b, n) for b in self.batch_buckets for n in self.control_counts
                     if n <= b]  # fmt: skip
            for i, c in enumerate(self.decode_buckets):
                keys += [("decode", b, c, k) for b in self.batch_buckets
                         for k in self.decode_steps]
                widths = sorted({min(p, c) for p in self.prefill_buckets})
                keys += [("insert", w, c) for w in widths]
                if len(self.batch_buckets) > 1:
                    keys.append(("move", c))
                if i > 0:
                    prev = self.decode_buckets[i - 1]
                    keys += [("resize", prev, c), ("resize", c, prev)]
        return list(dict.fromkeys(keys))

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
        if prefill:
            self.compile_continuations_in_background()

    # -- prefill -----------------------------------------------------------------------

    def prefill(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        out_pos: int = 0,
        *,
        controls: LogitsControls | None = None,
        mask: np.ndarray | None = None,
    ) -> Prefix:
        if controls is None and mask is None:
            return self.prefill_batch([tokens], [sampling], [out_pos])[0]
        return self._prefill_controlled(self._check_prompt(tokens), sampling, out_pos,
                                        controls, mask)  # fmt: skip

    def _prefill_controlled(self, ids: np.ndarray, sampling: SamplingParams, out_pos: int,
                            controls: LogitsControls | None, mask: np.ndarray | None) -> Prefix:
        """One prompt whose first token takes controls or a mask: the plain prefill pass, then
        the controls program on its logits (one row, its own ControlRows), then the prompt's
        logprobs when asked for."""
        controls = controls or LogitsControls()
        self._check_controls(controls)
        logits, lengths, k_np, v_np = self._prefill_pass([ids])
        ints, floats = self._sampling_rows(sampling, out_pos=out_pos)
        row = ControlRows(1, self.vocab_size)
        row.set(0, controls, ids, out_pos, None)
        masks = {} if mask is None else {0: np.asarray(mask, np.int32)}
        inputs = row.inputs(1, masks)
        program = self._program(("controls", 1, len(inputs) > 6))
        tok, lp, top_ids, top_lps = program(logits, ints, floats, *inputs)
        (prefix,) = self._prefixes(np.asarray(tok), np.asarray(lp), lengths[:1], k_np, v_np,
                                   [out_pos])  # fmt: skip
        k = controls.top_logprobs
        if k:
            prefix.first_top = TopLogprobs(np.asarray(top_ids)[:, :k].copy(),
                                           np.asarray(top_lps)[:, :k].copy())  # fmt: skip
        if controls.needs_history:
            prefix.context = ids.astype(np.int32)
        if controls.prompt_logprobs >= 0 and out_pos == 0:
            prefix.prompt_logprobs = self._prompt_logprobs(ids, controls.prompt_logprobs)
        return prefix

    def _prompt_logprobs(self, ids: np.ndarray, k: int) -> PromptLogprobs:
        """The raw logprob and rank of each prompt token after the first, with top k."""
        length = pick(self.prefill_buckets, len(ids))
        tokens = np.zeros(length, np.int32)
        tokens[: len(ids)] = ids
        lp, ranks, top_ids, top_lps = self._program(("prompt", length))(self.params, tokens)
        n = len(ids) - 1
        top = None
        if k:
            top = TopLogprobs(np.asarray(top_ids)[:n, :k].copy(),
                              np.asarray(top_lps)[:n, :k].copy())  # fmt: skip
        return PromptLogprobs(np.asarray(lp)[:n].copy(), np.asarray(ranks)[:n].copy(), top)

    def _check_controls(self, controls: LogitsControls) -> None:
        why = controls.outside(self.vocab_size)
        if why:
            raise ValueError(why)

    def prefill_batch(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: Sequence[SamplingParams],
        out_pos: Sequence[int] | None = None,
    ) -> list[Prefix]:
        """Several prompts, in as few compiled calls as the token budget allows (in order,
        each call padded to a (count, length) bucket); the same prefixes as one at a time."""
        if len(prompts) != len(samplings):
            raise ValueError("one SamplingParams per prompt")
        positions = list(out_pos) if out_pos is not None else [0] * len(prompts)
        checked = [self._check_prompt(p) for p in prompts]
        out: list[Prefix] = []
        start = 0
        while start < len(checked):
            end = start + 1
            while end < len(checked) and self._fits(checked[start:end + 1]):
                end += 1
            out += self._prefill_call(checked[start:end], samplings[start:end],
                                      positions[start:end])  # fmt: skip
            start = end
        return out

    def _check_prompt(self, tokens: Sequence[int]) -> np.ndarray:
        n = len(tokens)
        if not 1 <= n <= self.max_seq_len:
            raise ValueError(f"prompt of {n} tokens; this engine takes 1..{self.max_seq_len}")
        ids = np.asarray(tokens, np.int64)
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"token id outside the vocabulary [0, {self.vocab_size})")
        return ids

    def _prefill_shape(self, prompts: Sequence[np.ndarray]) -> tuple[int, int]:
        length = pick(self.prefill_buckets, max(len(p) for p in prompts))
        return pick(self.prefill_counts, len(prompts)), length

    def _fits(self, prompts: Sequence[np.ndarray]) -> bool:
        if len(prompts) > self.prefill_counts[-1]:
            return False
        return self._prefill_shape(prompts) in self.prefill_shapes

    def _prefill_call(
        self,
        prompts: Sequence[np.ndarray],
        samplings: Sequence[SamplingParams],
        out_pos: Sequence[int],
    ) -> list[Prefix]:
        count = self._prefill_shape(prompts)[0]
        ints = np.zeros((prog.INT_ROWS, count), np.int32)
        floats = np.zeros((prog.FLOAT_ROWS, count), np.float32)
        floats[prog.TOP_P] = 1.0
        for i, (sp, pos) in enumerate(zip(samplings, out_pos, strict=True)):
            ints[:, i:i + 1], floats[:, i:i + 1] = self._sampling_rows(sp, out_pos=pos)
        logits, lengths, k_np, v_np = self._prefill_pass(prompts)
        greedy_only = all(sp.temperature <= 0 for sp in samplings)
        tok, lp = self._program(("sample", count, greedy_only))(logits, ints, floats)
        return self._prefixes(np.asarray(tok), np.asarray(lp), lengths[:len(prompts)], k_np,
                              v_np, out_pos)  # fmt: skip

    def _prefill_pass(self, prompts: Sequence[np.ndarray]):
        """The model pass over prompts padded to their bucket: (logits [count, V] on device,
        lengths [count], k, v [count, layers, length, kv_heads, head_dim] as numpy)."""
        count, length = self._prefill_shape(prompts)
        tokens = np.zeros((count, length), np.int32)  # padding rows: one token of id 0
        lengths = np.ones(count, np.int32)
        for i, ids in enumerate(prompts):
            tokens[i, :len(ids)] = ids
            lengths[i] = len(ids)
        logits, k, v = self._program(("prefill", count, length))(self.params, tokens, lengths)
        return logits, lengths, np.asarray(k), np.asarray(v)

    def _prefixes(self, tok, lp, lengths, k_np, v_np, out_pos) -> list[Prefix]:
        return [
            Prefix(
                kv=[
                    np.ascontiguousarray(k_np[i, :, :n], self.cache_dtype),
                    np.ascontiguousarray(v_np[i, :, :n], self.cache_dtype),
                ],
                length=int(n),
                first_token=int(tok[i]),
                first_logprob=float(lp[i]),
                out_pos=out_pos[i],
            )
            for i, n in enumerate(lengths)
        ]

    # -- decode ------------------------------------------------------------------------

    def insert(
        self,
        prefix: Prefix,
        slot: int,
        sampling: SamplingParams,
        *,
        controls: LogitsControls | None = None,
    ) -> None:
        self._check_slot(slot)
        if controls is not None:
            self._check_controls(controls)
            if controls.needs_history and prefix.context is None:
                raise ValueError("these controls need the prompt (Prefix.context)")
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
        need = pick(self.decode_buckets, min(n + 1, self.max_seq_len))
        self._fit_capacity(max(self._capacity, need))
        width = min(pick(self.prefill_buckets, n), self._capacity)
        padded = []
        for arr in prefix.kv:
            out = np.zeros((cfg.layers, width, cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            out[:, :n] = arr  # copies (and converts) even a read-only frombuffer view
            padded.append(out)
        row = self._rows.take(slot)
        program = self._program(("insert", width, self._capacity))
        row_arg = np.int32(row)
        for layer in range(cfg.layers):
            self._cache_k[layer], self._cache_v[layer] = program(
                self._cache_k[layer], self._cache_v[layer], padded[0][layer], padded[1][layer],
                row_arg,
            )
        self._ints[:, row] = ints[:, 0]
        self._ints[prog.TOKEN, row] = prefix.first_token
        self._ints[prog.POS, row] = n
        self._floats[:, row] = floats[:, 0]
        self._live[row] = True
        if controls is not None:
            self._controls.set(row, controls, prefix.context, prefix.out_pos, prefix.first_token)
        else:
            self._controls.clear(row)

    def kv_layout(self, length: int) -> list[tuple[np.dtype, tuple[int, ...]]]:
        cfg = self.cfg  # k and v: [layers, length, kv_heads, head_dim] each
        return [(self.cache_dtype, (cfg.layers, length, cfg.kv_heads, cfg.head_dim))] * 2

    def generate(self, *, masks: StepMasks | None = None) -> StepOutput:
        out = self._run(1, masks)
        top = out.top
        return StepOutput(tokens=out.tokens[0], logprobs=out.logprobs[0], top=top)

    @property
    def controlled(self) -> bool:
        """Some live slot has logits controls: steps must go one at a time (generate)."""
        return bool(self._controls.on[self._live].any())

    def generate_many(self, steps: int) -> StepOutput:
        """`steps` decode steps in one dispatch (steps must be one of decode_steps): tokens and
        logprobs [steps, slots]. A slot that finishes midway still advances to the end; the
        caller drops its later tokens and frees it."""
        if steps not in self.decode_steps:
            raise ValueError(f"{steps} steps per call not compiled; have {self.decode_steps}")
        if self.controlled:  # each step needs its own mask and the previous step's tokens
            raise ValueError("a live slot has logits controls: one step per call (generate)")
        return self._run(steps)

    def _run(self, steps: int, masks: StepMasks | None = None) -> StepOutput:
        """Run `steps` steps over the live rows; tokens/logprobs [steps, slots] by slot."""
        tokens = np.zeros((steps, self.num_slots), np.int32)
        logprobs = np.zeros((steps, self.num_slots), np.float32)
        live = self._live
        n_live = int(live.sum())
        if n_live == 0:
            return StepOutput(tokens=tokens, logprobs=logprobs)
        batch = pick(self.batch_buckets, n_live)
        self._compact(batch)
        pos = self._ints[prog.POS]
        # A slot at max_seq_len has no room left: callers stop it before; clamping keeps
        # its writes inside its own row if one does not.
        np.minimum(pos, self.max_seq_len - 1, out=pos)
        need = min(int(pos[live].max()) + steps, self.max_seq_len)
        self._follow_need(pick(self.decode_buckets, need))
        # Holes below `batch` write junk at position 0 of their own row, inside capacity.
        pos[~live] = 0
        ints = np.ascontiguousarray(self._ints[:, :batch])
        program = self._program(("decode", batch, self._capacity, steps))
        top = None
        if steps == 1:
            self._cache_k, self._cache_v, tok, lp, logits = program(
                self.decode_params, self._cache_k, self._cache_v, ints
            )
            # the pass is dispatched: only now wait for the masks, which overlap it
            masked = self._masked_rows(masks, batch)
            if masked or self._controls.on[:batch][live[:batch]].any():
                tok, lp, top = self._controlled(batch, logits, ints, tok, lp, masked)
            elif (self._floats[prog.TEMP, :batch][live[:batch]] > 0).any():
                floats = np.ascontiguousarray(self._floats[:, :batch])
                tok, lp = self._program(("sample", batch, False))(logits, ints, floats)
            tok, lp = np.asarray(tok)[None], np.asarray(lp)[None]
        else:
            floats = np.ascontiguousarray(self._floats[:, :batch])
            self._cache_k, self._cache_v, tok, lp = program(
                self.decode_params, self._cache_k, self._cache_v, ints, floats
            )
            tok, lp = np.asarray(tok), np.asarray(lp)  # [steps, batch]
        rows = np.flatnonzero(live[:batch])
        slots = self._rows.slot_at[rows]
        tokens[:, slots] = tok[:, rows]
        logprobs[:, slots] = lp[:, rows]
        if top is not None:
            ids, lps = top
            top = TopLogprobs(np.zeros((self.num_slots, ids.shape[1]), np.int32),
                              np.zeros((self.num_slots, ids.shape[1]), np.float32))  # fmt: skip
            top.ids[slots], top.logprobs[slots] = ids[rows], lps[rows]
        if self._controls.on[rows].any():
            self._controls.record(rows.tolist(), tok[-1, rows].tolist())
        self._ints[prog.TOKEN, rows] = tok[-1, rows]
        self._ints[prog.POS, rows] = np.minimum(pos[rows] + steps, self.max_seq_len)
        self._ints[prog.OUT_POS, rows] += steps
        return StepOutput(tokens=tokens, logprobs=logprobs, top=top)

    def _masked_rows(self, masks: StepMasks | None, batch: int) -> dict[int, np.ndarray]:
        """{row: packed allowed bits} of the step's constrained live slots."""
        if masks is None or len(masks.slots) == 0:
            return {}
        bits = masks.wait()
        out = {}
        for i, slot in enumerate(np.asarray(masks.slots).tolist()):
            row = self._rows.row(slot)
            if 0 <= row < batch and self._live[row]:
                out[row] = np.asarray(bits[i], np.int32)
        return out

    def _controlled(self, batch: int, logits, ints: np.ndarray, tok, lp,
                    masked: dict[int, np.ndarray]):  # fmt: skip
        """The step's tokens [batch], logprobs [batch], and (top ids, top logprobs) [batch, 20]
        when some live row asked for alternatives. tok, lp: the decode program's greedy picks.

        The controls program runs only on the controlled rows (controls or a mask), gathered
        from the step's logits and padded to a count bucket: over the whole batch it cost
        every row 49,152 logits of masking and sorting for one constrained request. The plain
        rows get what a batch without controls gives them (the greedy picks, or the sampling
        program when a plain row samples: exactly a plain batch's), and the controlled rows'
        results are written over theirs."""
        live = self._live[:batch]
        processed = live & self._controls.on[:batch]
        for row in masked:
            processed[row] = True
        rows = np.flatnonzero(processed)
        n = len(rows)
        count = pick(self.control_counts, n)
        pick_rows = np.full(count, rows[0], np.int32)  # padding repeats a controlled row
        pick_rows[:n] = rows
        floats = np.ascontiguousarray(self._floats[:, :batch])
        inputs = self._controls.inputs(batch, masked, pick_rows)
        sub = self._program(("gather", batch, count))(logits, pick_rows)
        c_tok, c_lp, top_ids, top_lps = self._program(("controls", count, len(inputs) > 6))(
            sub, ints[:, pick_rows], floats[:, pick_rows], *inputs  # fancy indexing: copies
        )
        if (self._floats[prog.TEMP, :batch][live & ~processed] > 0).any():
            tok, lp = self._program(("sample", batch, False))(logits, ints, floats)
        tok, lp = np.array(tok), np.array(lp)  # writable copies
        tok[rows], lp[rows] = np.asarray(c_tok)[:n], np.asarray(c_lp)[:n]
        top = None
        if (self._controls.flags[ctl.TOP_K_LOGPROBS, rows] > 0).any():
            ids, lps = np.asarray(top_ids), np.asarray(top_lps)
            top = (np.zeros((batch, ids.shape[1]), np.int32),
                   np.zeros((batch, ids.shape[1]), np.float32))  # fmt: skip
            top[0][rows], top[1][rows] = ids[:n], lps[:n]
        return tok, lp, top

    def free(self, slot: int) -> None:
        self._check_slot(slot)
        row = self._rows.release(slot)
        if row >= 0:
            self._clear_row(row)

    # -- helpers -----------------------------------------------------------------------

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} outside 0..{self.num_slots - 1}")

    def _clear_row(self, row: int) -> None:
        self._live[row] = False
        self._ints[:, row] = 0
        self._floats[:, row] = (0.0, 1.0)  # greedy, so it never forces the sampling variant
        self._controls.clear(row)

    def _compact(self, batch: int) -> None:
        """Move live rows at or beyond `batch` into the holes below it (cache and inputs)."""
        moves = self._rows.plan_moves(batch)
        if not moves:
            return
        program = self._program(("move", self._capacity))
        for src, dst in moves:
            self._cache_k, self._cache_v = program(
                self._cache_k, self._cache_v, np.int32(src), np.int32(dst)
            )
            self._ints[:, dst] = self._ints[:, src]
            self._floats[:, dst] = self._floats[:, src]
            self._controls.move(src, dst)
            self._live[dst] = True
            self._clear_row(src)
        self.rows_moved += len(moves)

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
        ints = np.zeros((prog.INT_ROWS, 1), np.int32)
        ints[prog.OUT_POS] = out_pos
        ints[prog.TOP_K] = sp.top_k
        ints[prog.SEED] = np.uint32(sp.seed & 0xFFFFFFFF).view(np.int32)
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


def load_native(model: str, cfg: LlamaConfig) -> dict | None:
    """A GGUF file's own quantized blocks (weights_gguf.load_gguf_native); None otherwise."""
    if os.path.isfile(model) and not model.startswith("random:"):
        from splitserve.engine.weights_gguf import load_gguf_native

        return load_gguf_native(model, cfg)
    return None


def build_jax_engine(model: str, num_slots: int, max_seq_len: int, **options) -> JaxEngine:
    """The factory worker processes call; `options` go to JaxEngine (buckets, formats)."""
    cfg, weights = load_model(model)
    formats = {options.get("weight_format", "auto"), options.get("prefill_weight_format")}
    if formats & {"gguf", "auto"} and "native" not in options:
        options["native"] = load_native(model, cfg)
    return JaxEngine(cfg, weights, num_slots, max_seq_len, **options)
