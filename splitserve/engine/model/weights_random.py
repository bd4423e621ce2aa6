"""Random weights for a named preset: deterministic in the seed, for tests and benchmarks.

The scales keep activations and logits in a realistic range (a peaked but not one-hot
next-token distribution), so greedy and sampled decoding both exercise real code paths.
"""

from __future__ import annotations

import numpy as np

from splitserve.engine.model.llama_config import LlamaConfig


def random_weights(cfg: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Canonical weights (see llama_model) drawn from a seeded generator, float32."""
    rng = np.random.default_rng(seed)
    c = cfg

    def mat(*shape: int) -> np.ndarray:
        fan_in = shape[-2]
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)

    def norm(*shape: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    w = {
        # std 2/sqrt(hidden): a tied head then gives logits of std ~2.
        "embed": rng.standard_normal((c.vocab_size, c.hidden), dtype=np.float32)
        * np.float32(2.0 / np.sqrt(c.hidden)),
        "attn_norm": norm(c.layers, c.hidden),
        "wq": mat(c.layers, c.hidden, c.heads * c.head_dim),
        "wk": mat(c.layers, c.hidden, c.kv_heads * c.head_dim),
        "wv": mat(c.layers, c.hidden, c.kv_heads * c.head_dim),
        "wo": mat(c.layers, c.heads * c.head_dim, c.hidden),
        "ffn_norm": norm(c.layers, c.hidden),
        "w_gate": mat(c.layers, c.hidden, c.intermediate),
        "w_up": mat(c.layers, c.hidden, c.intermediate),
        "w_down": mat(c.layers, c.intermediate, c.hidden),
        "final_norm": norm(c.hidden),
    }
    if not c.tie_embeddings:
        w["head"] = 2.0 * mat(c.hidden, c.vocab_size)
    return w
