"""Engines behind one interface: the JAX Llama engine and the fake arithmetic engine."""

from __future__ import annotations

import logging
import os

from splitserve.config import ModelConfig, RouterConfig
from splitserve.engine.compile.buckets import length_buckets
from splitserve.engine.interface import Engine

log = logging.getLogger(__name__)


def build_engine(
    model: ModelConfig,
    vocab_size: int,
    role: str | None = None,
    most_slots: int = RouterConfig.max_running,
) -> Engine:
    """The engine a worker drives. vocab_size (the tokenizer's) sizes the fake engine only;
    role ("prefill" or "decode") picks the XLA thread count (model.cpu_threads is decode's,
    model.prefill_cpu_threads prefill's) and the side whose weights the JAX engine prepares
    (None: both, as benchmarks use it); most_slots holds num_slots "auto" ([router]
    max_running: slots beyond what runs at once would never fill)."""
    if model.engine == "fake":
        from splitserve.engine.fake.engine import FakeEngine
        from splitserve.engine.slot_count import FAKE_ENGINE_SLOTS

        return FakeEngine(
            model.num_slots if model.num_slots != "auto" else FAKE_ENGINE_SLOTS,
            model.max_seq_len,
            vocab_size,
            step_s=model.fake_step_s,
            prefill_s=model.fake_prefill_s,
        )
    from splitserve.engine.compile.jax_setup import backend_started, configure_jax_runtime
    from splitserve.engine.jax.build import build_jax_engine

    if not backend_started():  # in threads mode the second engine finds JAX set up already
        threads = model.cpu_threads if role != "prefill" else prefill_threads(model)
        configure_jax_runtime(cpu_threads=threads or None)
    # the compiled programs are kept as executables there (engine/compile/executables.py: a restart
    # loads them without tracing), instead of in JAX's own persistent cache
    cache = model.compile_cache_dir
    executables = os.path.join(cache, "executables") if cache else None
    return build_jax_engine(
        resolve_model_path(model.path), model.num_slots, model.max_seq_len,
        kv_cache_bytes=int(model.kv_cache_mib * (1 << 20)), most_slots=most_slots,
        prefill_buckets=tuple(model.prefill_buckets) or None,
        prefix_reuse=model.prefix_cache and role == "prefill",
        executable_dir=executables,
        sides=(role,) if role else ("prefill", "decode"),
        huge_pages=model.huge_pages,
        **batching_options(model, role),
    )  # fmt: skip


def prefill_threads(model: ModelConfig, cpus: int | None = None) -> int:
    """The prefill engine's XLA thread count ([model] prefill_cpu_threads; 0: one per CPU):
    "auto" is half of `cpus` (default: the CPUs this process may run on), at least one."""
    if model.prefill_cpu_threads != "auto":
        return int(model.prefill_cpu_threads)
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cpus or 1) // 2)


def prefill_weight_format(model: ModelConfig, flags: frozenset[str] | None = None) -> str:
    """The prefill side's matrices ([model] prefill_weight_format): "auto" is the kernel's packed
    bfloat16 products (bfloat16-native) where the CPU has AMX tiles or AVX512-BF16's dot
    products, which run a burst of prompts several times as fast as float32 (lab/benchmarks.md,
    "Prefill in bfloat16", "Prefill on the tiles", "Prefill in bfloat16 without tiles"),
    float32 elsewhere (exact). Some answers differ between the two. `flags`: the CPU's
    (default: this one's)."""
    if model.prefill_weight_format != "auto":
        return model.prefill_weight_format
    from splitserve.engine.kernels.cpu_features import (
        cpu_flags,
        has_bf16_dot_products,
        has_bf16_matrix_units,
    )

    flags = cpu_flags() if flags is None else flags
    units = has_bf16_matrix_units(flags) or has_bf16_dot_products(flags)
    chosen = "bfloat16-native" if units else "float32"
    # the operator sees what "auto" became on this host (answers differ between the two)
    log.info('prefill_weight_format "auto": %s (the CPU %s bfloat16 units)', chosen,
             "has" if units else "has no")  # fmt: skip
    return chosen


def batching_options(model: ModelConfig, role: str | None) -> dict:
    """What each side's engine compiles beyond one prompt a call and one step a dispatch: the
    prefill side its (count, length) programs within the token budget, the decode side its
    k-step programs (a worker compiles only its own side's: the other's would be for nothing)
    in its weight format."""
    options: dict = {}
    if role != "decode":
        budget = model.prefill_batch_tokens
        # counts 1, 2, 4, ... up to a call of the shortest (16-token) prompts, at most
        # num_slots: more prompts than decode slots would wait at decode anyway ("auto" slots
        # are settled by the decode worker's model: the budget alone bounds them here)
        largest = budget // 16
        if model.num_slots != "auto":
            largest = min(largest, model.num_slots)
        largest = max(1, largest)
        options["prefill_counts"] = length_buckets(1, largest)
        options["prefill_batch_tokens"] = max(budget, 1)
        options["prefill_weight_format"] = prefill_weight_format(model)
    if role != "prefill":
        options["decode_steps"] = (model.decode_steps,)
        options["decode_steps_max_live"] = model.decode_steps_max_live
        options["weight_format"] = model.weight_format
    return options


def resolve_model_path(path: str) -> str:
    if path == "default":
        from splitserve.engine.model.default_model import default_model_path

        return default_model_path()
    return path
