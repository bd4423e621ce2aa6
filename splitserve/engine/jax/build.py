"""The JAX engine a worker process builds from a model's name (engine/model/model_files.py)."""

from __future__ import annotations

import logging

import numpy as np

from splitserve.engine.jax.engine import JaxEngine
from splitserve.engine.model.model_files import load_model, load_native
from splitserve.engine.slot_count import auto_slots

log = logging.getLogger(__name__)


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
