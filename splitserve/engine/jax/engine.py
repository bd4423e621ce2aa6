"""JaxEngine: the Engine interface over the Llama math (engine/model/), with a slot-based KV cache.

1. `prefill` pads the prompt to a length bucket (one compiled program per bucket), runs it,
   samples output position 0, and returns the KV cache cut to the true length as numpy;
   `prefill_batch` runs several prompts in one call, padded to a (count, length) bucket within
   a token budget, with the same results as one at a time (prefill.py). `prefill_cached` runs
   only the tokens after a cached prefix (prefix_reuse.py).
2. `insert` copies such a prefix into the cache row of its slot and records the row's inputs
   on the host (decode.py, kv_cache.py, slot_table.py).
3. `generate` runs one compiled step over the live rows, `generate_many(k)` k steps in one
   dispatch; rows with logits controls or a grammar mask take a third program (controlled.py).
4. `free` marks the slot unused.

Its parts, each built here from what it needs: the shapes every size pads to (shapes.py), each
side's weights in its format (weights.py), the programs those shapes make (program_specs.py)
and their executables (compile/program_table.py). Every program is compiled ahead of time
(`warmup`) and kept as an executable, so no step ever pays a compile after the worker says
Ready; with an `executable_dir` they are stored there too, and a restart loads them instead of
compiling (compile/executables.py). Only the programs that have a stand-in may come after
Ready on a cold start (the k-step decode programs: k single steps meanwhile; the prefix cache's
continuations: the whole prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from splitserve.engine.compile.executables import ExecutableStore
from splitserve.engine.compile.program_table import ProgramTable
from splitserve.engine.interface import (
    Engine,
    LogitsControls,
    Prefix,
    SamplingParams,
    StepMasks,
    StepOutput,
)
from splitserve.engine.jax.controlled import ControlledStep
from splitserve.engine.jax.decode import DecodeStepper
from splitserve.engine.jax.kv_cache import KvCache
from splitserve.engine.jax.prefill import PrefillRunner
from splitserve.engine.jax.prefix_reuse import CachedPrefill
from splitserve.engine.jax.program_specs import ProgramSpecs, attention_paths
from splitserve.engine.jax.shapes import engine_shapes
from splitserve.engine.jax.slot_table import SlotTable
from splitserve.engine.jax.weights import side_params
from splitserve.engine.kernels import qkernel, quant
from splitserve.engine.model.llama_config import LlamaConfig


class JaxEngine(Engine):
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
        """weights: canonical numpy weights (model/params.py); native: a GGUF file's own blocks
        (weight format "gguf"); sides: the sides whose weights to prepare (a worker runs one);
        prefix_reuse: whether warm-up obtains prefill_cached's programs (the cache is on)."""
        if num_slots < 1 or max_seq_len < 2:
            raise ValueError(
                f"need num_slots >= 1 and max_seq_len >= 2, got {num_slots}, {max_seq_len}"
            )
        self.cfg = cfg
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.vocab_size = cfg.vocab_size
        self.cache_dtype = np.dtype(cache_dtype)
        self.shapes = shapes = engine_shapes(
            num_slots, max_seq_len, prefill_buckets=prefill_buckets,
            decode_buckets=decode_buckets, batch_sizes=batch_sizes,
            prefill_counts=prefill_counts, prefill_batch_tokens=prefill_batch_tokens,
            decode_steps=decode_steps, decode_steps_max_live=decode_steps_max_live,
        )  # fmt: skip
        self.attention, self.prompt_attention = attention_paths(attention, cfg)
        self.sides = tuple(sides)
        self.side_params = params = side_params(
            cfg, weights, sides=self.sides, batch_buckets=shapes.batch_buckets,
            weight_format=weight_format, prefill_weight_format=prefill_weight_format,
            native=native, param_dtype=param_dtype,
            float32_rows_max_batch=float32_rows_max_batch, huge_pages=huge_pages,
        )  # fmt: skip
        self.weight_format = params.weight_format
        self.prefill_weight_format = params.prefill_weight_format
        self.params = params.prefill  # the prefill side's
        self.decode_params = params.decode_at[shapes.batch_buckets[0]]  # the smallest batch's
        self.specs = ProgramSpecs(cfg, shapes, params, self.cache_dtype, self.attention,
                                  self.prompt_attention, prefix_reuse)  # fmt: skip
        store = ExecutableStore(executable_dir, self.specs.identity()) if executable_dir else None
        self.programs = programs = ProgramTable(self.specs, store)
        self.prefill_runner = PrefillRunner(cfg.vocab_size, shapes, programs, self.params,
                                            self.cache_dtype)  # fmt: skip
        self.cached_prefill = CachedPrefill(cfg, shapes.prefill_buckets, programs, self.params,
                                            self.cache_dtype, self.prefill_runner)  # fmt: skip
        cache = KvCache(cfg, num_slots, self.cache_dtype, shapes.decode_buckets, programs,
                        shrink_after_steps)  # fmt: skip
        self.decode_stepper = DecodeStepper(
            shapes, programs, params.decode_at, cache, SlotTable(num_slots, cfg.vocab_size),
            ControlledStep(programs, shapes.control_counts),
        )

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

    # -- decode ------------------------------------------------------------------------

    def insert(
        self,
        prefix: Prefix,
        slot: int,
        sampling: SamplingParams,
        *,
        controls: LogitsControls | None = None,
    ) -> None:
        self.decode_stepper.insert(prefix, slot, sampling, controls)

    def kv_layout(self, length: int) -> list[tuple[np.dtype, tuple[int, ...]]]:
        cfg = self.cfg  # k and v: [layers, length, kv_heads, head_dim] each
        return [(self.cache_dtype, (cfg.layers, length, cfg.kv_heads, cfg.head_dim))] * 2

    def generate(self, *, masks: StepMasks | None = None) -> StepOutput:
        out = self.decode_stepper.step(1, masks)
        return StepOutput(tokens=out.tokens[0], logprobs=out.logprobs[0], top=out.top)

    def generate_many(self, steps: int) -> StepOutput:
        return self.decode_stepper.generate_many(steps)

    def multi_step_ready(self, steps: int) -> bool:
        return self.decode_stepper.multi_step_ready(steps)

    @property
    def multistep_pending(self) -> int:
        return self.programs.pending_count("decode")

    @property
    def controlled(self) -> bool:
        """Some live slot has logits controls: steps must go one at a time (generate)."""
        return self.decode_stepper.table.controlled

    @property
    def rows_moved(self) -> int:
        """Compaction moves so far (a figure for benchmarks)."""
        return self.decode_stepper.rows_moved

    def free(self, slot: int) -> None:
        self.decode_stepper.free(slot)

    def share_cores(self, marks: memoryview | None, threads: int) -> None:
        """The kernel's calls (the decode layers, the head) follow the marks; XLA's own ops (a
        batch above the kernel's rows) keep the pool's threads."""
        if qkernel.available():
            qkernel.share_cores(marks, threads)
