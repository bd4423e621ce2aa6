"""Engines behind one interface: the JAX Llama engine and the fake arithmetic engine."""

from __future__ import annotations

import os

from splitserve.config import ModelConfig
from splitserve.engine.interface import Engine


def build_engine(model: ModelConfig, vocab_size: int, role: str | None = None) -> Engine:
    """The engine a worker drives. vocab_size (the tokenizer's) sizes the fake engine only;
    role ("prefill" or "decode") picks the XLA thread count (model.cpu_threads is decode's)
    and the side whose weights the JAX engine prepares (None: both, as benchmarks use it)."""
    if model.engine == "fake":
        from splitserve.engine.fake import FakeEngine

        return FakeEngine(
            model.num_slots,
            model.max_seq_len,
            vocab_size,
            step_s=model.fake_step_s,
            prefill_s=model.fake_prefill_s,
        )
    from splitserve.engine.jax_engine import build_jax_engine
    from splitserve.engine.jax_setup import backend_started, configure_jax_runtime

    if not backend_started():  # in threads mode the second engine finds JAX set up already
        threads = model.cpu_threads if role != "prefill" else 0
        configure_jax_runtime(cpu_threads=threads or None)
    # the compiled programs are kept as executables there (engine/executables.py: a restart
    # loads them without tracing), instead of in JAX's own persistent cache
    cache = model.compile_cache_dir
    executables = os.path.join(cache, "executables") if cache else None
    return build_jax_engine(
        resolve_model_path(model.path), model.num_slots, model.max_seq_len,
        prefill_buckets=tuple(model.prefill_buckets) or None,
        prefix_reuse=model.prefix_cache and role == "prefill",
        executable_dir=executables,
        sides=(role,) if role else ("prefill", "decode"),
    )  # fmt: skip


def resolve_model_path(path: str) -> str:
    if path == "default":
        from splitserve.engine.default_model import default_model_path

        return default_model_path()
    return path
