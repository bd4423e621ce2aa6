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
   holds the live slots, which first move into rows [0, n) for n live (a live row at or
   beyond n moves into a hole below it): the native kernel's products compute those n rows
   only (programs.LIVE), so one stream costs a batch of one and 12 live slots in the 16-row
   program about what 12 rows cost. The cache buffers are donated so the new
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

Matrices take the form `weight_format` names (quant.WEIGHT_FORMATS): float32 (on the decode
side as rows in the native kernel, on the prefill side for XLA: quant.side_form), or a
quantized form for the native kernel; prefill may use another (`prefill_weight_format`).
"auto" (the default) keeps a GGUF file's own Q8_0/Q4_0/Q4_1 blocks (exact, and the fastest
measured) and float32 for any other checkpoint (int8 and bfloat16 round its weights: opt-in);
prefill defaults to float32, and may take XLA's bfloat16 products instead (quant.BF16_XLA:
weights and activations rounded, float32 sums), which CPUs with bfloat16 matrix units run
several times as fast.
Every program is compiled ahead of time (`warmup`, compile/program_table.py) and kept as an
executable, so no step ever pays a compile after the worker says Ready; with an
`executable_dir` they are stored there too, and a restart loads them instead of compiling
(compile/executables.py). Only the programs that have a stand-in may come after Ready on a
cold start (the k-step decode programs: k single steps meanwhile).
The prefill path is prefill.py, prefill from a cached prefix prefix_reuse.py, the controlled
rows of a decode step controlled.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from splitserve.engine.compile.buckets import (
    pick,
)
from splitserve.engine.compile.executables import ExecutableStore
from splitserve.engine.compile.program_table import ProgramTable
from splitserve.engine.interface import (
    Engine,
    LogitsControls,
    Prefix,
    SamplingParams,
    StepMasks,
    StepOutput,
    TopLogprobs,
)
from splitserve.engine.jax import programs as prog
from splitserve.engine.jax.control_rows import ControlRows, check_controls
from splitserve.engine.jax.controlled import ControlledSteps
from splitserve.engine.jax.kv_cache import cache_shapes
from splitserve.engine.jax.prefill import PrefillRunner
from splitserve.engine.jax.prefix_reuse import CachedPrefill
from splitserve.engine.jax.program_specs import ProgramSpecs, attention_paths
from splitserve.engine.jax.shapes import engine_shapes
from splitserve.engine.jax.slot_rows import SlotRows
from splitserve.engine.jax.weights import side_params
from splitserve.engine.kernels import qkernel, quant
from splitserve.engine.model.llama_config import LlamaConfig
from splitserve.engine.model.model_files import load_model, load_native
from splitserve.engine.slot_count import auto_slots

__all__ = ["JaxEngine", "build_jax_engine", "load_model", "load_native"]

log = logging.getLogger(__name__)


class JaxEngine(ControlledSteps, Engine):
    """Llama in JAX behind the Engine interface (see the module docstring)."""

    supports_controls = True
    supports_prefix_reuse = True

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
        decode_steps_max_live: int | None = None,
        weight_format: str = "auto",
        prefill_weight_format: str | None = None,
        float32_rows_max_batch: int = quant.ROWS_MAX_BATCH,
        attention: str = "auto",
        native: dict | None = None,
        param_dtype=jnp.float32,
        cache_dtype=jnp.float32,
        shrink_after_steps: int = 256,
        prefix_reuse: bool = False,
        executable_dir: str | None = None,
        sides: Sequence[str] = ("prefill", "decode"),
        huge_pages: bool = True,
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
        self.shapes = engine_shapes(
            num_slots, max_seq_len, prefill_buckets=prefill_buckets,
            decode_buckets=decode_buckets, batch_sizes=batch_sizes,
            prefill_counts=prefill_counts, prefill_batch_tokens=prefill_batch_tokens,
            decode_steps=decode_steps, decode_steps_max_live=decode_steps_max_live,
        )  # fmt: skip
        self.attention, self.prompt_attention = attention_paths(attention, cfg)
        self.sides = tuple(sides)
        self.side_params = side_params(
            cfg, weights, sides=self.sides, batch_buckets=self.shapes.batch_buckets,
            weight_format=weight_format, prefill_weight_format=prefill_weight_format,
            native=native, param_dtype=param_dtype,
            float32_rows_max_batch=float32_rows_max_batch, huge_pages=huge_pages,
        )  # fmt: skip
        self.weight_format = self.side_params.weight_format
        self.prefill_weight_format = self.side_params.prefill_weight_format
        self._decode_params_at = self.side_params.decode_at
        self.decode_params = self._decode_params_at[self.shapes.batch_buckets[0]]  # the smallest's
        self.params = self.side_params.prefill  # the prefill side's
        self._capacity = self.shapes.decode_buckets[0]
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
        self.rows_moved = 0  # compaction moves so far (a figure for benchmarks)
        self.specs = ProgramSpecs(cfg, self.shapes, self.side_params, self.cache_dtype,
                                  self.attention, self.prompt_attention, prefix_reuse)  # fmt: skip
        # compiled programs kept for the next start (compile/executables.py)
        store = ExecutableStore(executable_dir, self.specs.identity()) if executable_dir else None
        self.programs = ProgramTable(self.specs, store)
        self.prefill_runner = PrefillRunner(cfg.vocab_size, self.shapes, self.programs,
                                            self.params, self.cache_dtype)  # fmt: skip
        self.cached_prefill = CachedPrefill(cfg, self.shapes.prefill_buckets, self.programs,
                                            self.params, self.cache_dtype,
                                            self.prefill_runner)  # fmt: skip

    def warmup(
        self, prefill: bool = True, decode: bool = True, threads: int | None = None,
        progress=None, background: bool = True, quiet=None,
    ) -> None:  # fmt: skip
        """Obtain every program but the deferred ones before the worker says Ready (those the
        store has are loaded too; the rest compile in the background, from here, or when
        self.programs.compile_in_background() is called if background is False). A prefill
        worker needs only the prefill side, a decode worker only the decode side."""
        self.programs.warmup(self.specs.keys(prefill, decode),
                             self.specs.deferred_keys(prefill, decode), threads, progress,
                             background, quiet)  # fmt: skip

    def close(self) -> None:
        self.programs.close()

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
        return self.prefill_runner.prefill(tokens, sampling, out_pos, controls=controls,
                                           mask=mask)  # fmt: skip

    def prefill_batch(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: Sequence[SamplingParams],
        out_pos: Sequence[int] | None = None,
    ) -> list[Prefix]:
        return self.prefill_runner.prefill_batch(prompts, samplings, out_pos)

    def prefill_cached(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        cached_kv: list[np.ndarray],
        out_pos: int = 0,
        **options,
    ) -> Prefix:
        return self.cached_prefill.prefill_cached(tokens, sampling, cached_kv, out_pos,
                                                  **options)  # fmt: skip

    @property
    def continuations_pending(self) -> int:
        """Continuation programs the background thread has still to obtain."""
        return self.programs.pending_count("prefill_cont")

    def _empty_cache(self, capacity: int) -> tuple[list, list]:
        k, v = cache_shapes(self.cfg, self.num_slots, capacity)
        layers = range(self.cfg.layers)
        dt = self.cache_dtype
        return [jnp.zeros(k, dt) for _ in layers], [jnp.zeros(v, dt) for _ in layers]

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
            check_controls(controls, self.vocab_size)
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
        ints, floats = prog.sampling_rows(sampling, out_pos=prefix.out_pos + 1)
        # Room for the prefix and the first decoded token's K/V.
        need = pick(self.shapes.decode_buckets, min(n + 1, self.max_seq_len))
        self._fit_capacity(max(self._capacity, need))
        width = min(pick(self.shapes.prefill_buckets, n), self._capacity)
        padded = []
        for arr in prefix.kv:
            out = np.zeros((cfg.layers, width, cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            out[:, :n] = arr  # copies (and converts) even a read-only frombuffer view
            padded.append(out)
        row = self._rows.take(slot)
        program = self.programs.get(("insert", width, self._capacity))
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
        if steps not in self.shapes.decode_steps:
            have = self.shapes.decode_steps
            raise ValueError(f"{steps} steps per call not compiled; have {have}")
        if self.controlled:  # each step needs its own mask and the previous step's tokens
            raise ValueError("a live slot has logits controls: one step per call (generate)")
        if steps > 1 and int(self._live.sum()) > self.shapes.decode_steps_max_live:
            raise ValueError(f"{steps} steps per call compiled for at most "
                             f"{self.shapes.decode_steps_max_live} live slots")  # fmt: skip
        if not self.multi_step_ready(steps):  # its program still compiling: the same tokens
            outs = [self._run(1) for _ in range(steps)]
            return StepOutput(tokens=np.concatenate([o.tokens for o in outs]),
                              logprobs=np.concatenate([o.logprobs for o in outs]))  # fmt: skip
        return self._run(steps)

    def share_cores(self, marks: memoryview | None, threads: int) -> None:
        """The kernel's calls (the decode layers, the head) follow the marks; XLA's own ops (a
        batch above the kernel's rows) keep the pool's threads."""
        if qkernel.available():
            qkernel.share_cores(marks, threads)

    @property
    def multistep_pending(self) -> int:
        return self.programs.pending_count("decode")

    def multi_step_ready(self, steps: int) -> bool:
        """Whether the next dispatch of `steps` steps finds its program (False while it is
        still compiling after a cold start's warm-up: generate_many then runs single steps)."""
        live = self._live
        n_live = int(live.sum())
        if steps == 1 or n_live == 0 or not self.programs.any_deferred:
            return True
        batch, target = self._dispatch_shape(n_live, steps)
        # the capacity _run will use: the target (grown at once, or shrunk at this step) or
        # the present one
        capacities = {target, max(target, self._capacity)}
        return not any(self.programs.deferred(("decode", batch, c, steps)) for c in capacities)

    def _dispatch_shape(self, n_live: int, steps: int) -> tuple[int, int]:
        """(batch bucket, capacity bucket the live sequences need) for a dispatch of `steps`."""
        pos = self._ints[prog.POS]
        need = min(int(pos[self._live].max()) + steps, self.max_seq_len)
        return pick(self.shapes.batch_buckets, n_live), pick(self.shapes.decode_buckets, need)

    def _run(self, steps: int, masks: StepMasks | None = None) -> StepOutput:
        """Run `steps` steps over the live rows; tokens/logprobs [steps, slots] by slot."""
        tokens = np.zeros((steps, self.num_slots), np.int32)
        logprobs = np.zeros((steps, self.num_slots), np.float32)
        live = self._live
        n_live = int(live.sum())
        if n_live == 0:
            return StepOutput(tokens=tokens, logprobs=logprobs)
        # live rows packed into [0, n_live), not just below the bucket: the kernel's products
        # then compute those rows only (programs.LIVE)
        self._compact(n_live)
        pos = self._ints[prog.POS]
        # A slot at max_seq_len has no room left: callers stop it before; clamping keeps
        # its writes inside its own row if one does not.
        np.minimum(pos, self.max_seq_len - 1, out=pos)
        batch, target = self._dispatch_shape(n_live, steps)
        self._follow_need(target)
        # Padding rows [n_live, batch) write junk at position 0 of their own row, inside
        # capacity.
        pos[~live] = 0
        ints = np.ascontiguousarray(self._ints[:, :batch])
        ints[prog.LIVE] = n_live
        program = self.programs.get(("decode", batch, self._capacity, steps))
        top = None
        if steps == 1:
            self._cache_k, self._cache_v, tok, lp, logits = program(
                self._decode_params_at[batch], self._cache_k, self._cache_v, ints
            )
            # the pass is dispatched: only now wait for the masks, which overlap it
            masked = self._masked_rows(masks, batch)
            if masked or self._controls.on[:batch][live[:batch]].any():
                tok, lp, top = self._controlled(batch, logits, ints, tok, lp, masked)
            elif (self._floats[prog.TEMP, :batch][live[:batch]] > 0).any():
                floats = np.ascontiguousarray(self._floats[:, :batch])
                tok, lp = self.programs.get(("sample", batch, False))(logits, ints, floats)
            tok, lp = np.asarray(tok)[None], np.asarray(lp)[None]
        else:
            floats = np.ascontiguousarray(self._floats[:, :batch])
            self._cache_k, self._cache_v, tok, lp = program(
                self._decode_params_at[batch], self._cache_k, self._cache_v, ints, floats
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

    def _compact(self, height: int) -> None:
        """Move live rows at or beyond `height` into the holes below it (cache and inputs)."""
        moves = self._rows.plan_moves(height)
        if not moves:
            return
        program = self.programs.get(("move", self._capacity))
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
            i = self.shapes.decode_buckets.index(self._capacity)
            nxt = self.shapes.decode_buckets[i + 1 if target > self._capacity else i - 1]
            program = self.programs.get(("resize", self._capacity, nxt))
            resized = [program(k, v) for k, v in zip(self._cache_k, self._cache_v, strict=True)]
            self._cache_k = [k for k, _ in resized]
            self._cache_v = [v for _, v in resized]
            self._capacity = nxt


def build_jax_engine(
    model: str, num_slots: int | str, max_seq_len: int, *, kv_cache_bytes: int = 0,
    most_slots: int = 0, **options,
) -> JaxEngine:  # fmt: skip
    """The factory worker processes call; `options` go to JaxEngine (buckets, formats, sides).
    num_slots "auto": as many as kv_cache_bytes holds at max_seq_len, at most most_slots
    (slot_count.py). A GGUF file's own blocks are read only when a side this engine runs may
    use them."""
    cfg, weights = load_model(model)
    sides = options.get("sides", ("prefill", "decode"))
    if num_slots == "auto":
        itemsize = np.dtype(options.get("cache_dtype", np.float32)).itemsize
        per_token = cfg.kv_bytes_per_token(itemsize)
        num_slots = auto_slots(per_token, max_seq_len, kv_cache_bytes, most_slots)
        per_slot = per_token * max_seq_len
        if "decode" in sides:  # the operator sees what "auto" became, and from what
            log.info('num_slots "auto": %d (%.1f MiB of KV cache a slot at %d positions, '
                     "within %.0f MiB, at most %d)", num_slots, per_slot / (1 << 20),
                     max_seq_len, kv_cache_bytes / (1 << 20), most_slots)  # fmt: skip
    formats = {options.get("prefill_weight_format")}
    if "decode" in sides:
        formats.add(options.get("weight_format", "auto"))
    if formats & {"gguf", "auto"} and "native" not in options:
        options["native"] = load_native(model, cfg)
    return JaxEngine(cfg, weights, num_slots, max_seq_len, **options)
