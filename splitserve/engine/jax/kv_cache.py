"""The decode slots' K/V on the device: one buffer pair per layer, a row per slot.

XLA on CPU copies the slices of a stacked buffer before using them, hence a pair per layer:
keys [rows, kv_heads, head_dim, capacity] (transposed, so q.K reads along the last axis),
values [rows, kv_heads, capacity, head_dim].
"""

from __future__ import annotations

from splitserve.engine.model.llama_config import LlamaConfig


def cache_shapes(cfg: LlamaConfig, rows: int, capacity: int) -> tuple[tuple, tuple]:
    """One layer's (keys, values) buffer shapes."""
    k = (rows, cfg.kv_heads, cfg.head_dim, capacity)  # keys transposed
    v = (rows, cfg.kv_heads, capacity, cfg.head_dim)
    return k, v
