"""Canonical numpy weights (llama_model.py's layout) to the device pytree the jitted functions
take: Q/K/V and gate/up fused into one matrix each (one matmul instead of three or two per layer
and step), one array per layer, the head materialised even when tied (in column blocks for a
large vocabulary), each matrix in its weight format (kernels/quant.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from splitserve.engine.kernels import quant
from splitserve.engine.model.llama_config import LlamaConfig

HEAD_BLOCK = 4096  # output-head columns per matmul for large vocabularies (see prepare_params)


def check_weights(cfg: LlamaConfig, w: dict[str, np.ndarray]) -> None:
    """Fail early, with the tensor's name, when a loader produced a wrong shape."""
    c = cfg
    expected = {
        "embed": (c.vocab_size, c.hidden),
        "attn_norm": (c.layers, c.hidden),
        "wq": (c.layers, c.hidden, c.heads * c.head_dim),
        "wk": (c.layers, c.hidden, c.kv_heads * c.head_dim),
        "wv": (c.layers, c.hidden, c.kv_heads * c.head_dim),
        "wo": (c.layers, c.heads * c.head_dim, c.hidden),
        "ffn_norm": (c.layers, c.hidden),
        "w_gate": (c.layers, c.hidden, c.intermediate),
        "w_up": (c.layers, c.hidden, c.intermediate),
        "w_down": (c.layers, c.intermediate, c.hidden),
        "final_norm": (c.hidden,),
    }
    if not c.tie_embeddings:
        expected["head"] = (c.hidden, c.vocab_size)
    shape_of = getattr(w, "shape_of", lambda name: tuple(w[name].shape))  # lazy: no load
    for name, shape in expected.items():
        if name not in w:
            raise ValueError(f"weights lack {name!r}")
        if shape_of(name) != shape:
            raise ValueError(f"weight {name!r} has shape {shape_of(name)}, expected {shape}")


def prepare_params(
    cfg: LlamaConfig,
    w: dict[str, np.ndarray],
    dtype=jnp.float32,
    *,
    weights: str = "float32",
    native: dict | None = None,
) -> dict:
    """Canonical numpy weights -> the device pytree the jitted functions take.

    Each layer's matrices are separate arrays, not slices of stacked ones: XLA on CPU
    copies a slice of a stacked weight before handing it to a matmul, every step.
    weights: the matrices' form (quant.WEIGHT_FORMATS): float32 arrays in `dtype` for XLA, or
    QMatrix for the native kernel; native: a GGUF file's own blocks (weights="gguf").
    """
    check_weights(cfg, w)
    native = native or {}
    # Norm weights stay float32 whatever the matmul dtype: they are tiny and precision-bound.
    f32 = lambda a: jnp.asarray(a, jnp.float32)

    def mat(names: list[str], i: int | None = None):
        parts = lambda: [w[n] if i is None else w[n][i] for n in names]  # noqa: E731
        got = [native.get(n) for n in names]
        own = None if any(g is None for g in got) else [g if i is None else g[i] for g in got]
        return quant.device_matrix(weights, parts, own, dtype)

    layers = [
        {
            "attn_norm": f32(w["attn_norm"][i]),  # [hidden]
            # [hidden, (heads + 2 kv_heads) * head_dim]: one matmul instead of three
            "wqkv": mat(["wq", "wk", "wv"], i),
            "wo": mat(["wo"], i),  # [heads * head_dim, hidden]
            "ffn_norm": f32(w["ffn_norm"][i]),  # [hidden]
            "w_gate_up": mat(["w_gate", "w_up"], i),  # [H, 2I]
            "w_down": mat(["w_down"], i),  # [intermediate, hidden]
        }
        for i in range(cfg.layers)
    ]
    head_of = lambda: w["embed"].T if cfg.tie_embeddings else w["head"]  # noqa: E731 [hidden, vocab]
    head_native = native.get("head")
    # The head of a bfloat16 prompt pass (either form) stays float32: it multiplies one row
    # per prompt, which XLA does not hand to the bfloat16 units but widens the whole bfloat16
    # matrix for, every call, which cost more than the float32 blocks below.
    head_form = "float32" if weights in quant.BF16_FORMS else weights
    head_q = quant.device_matrix(head_form, lambda: [head_of()], head_native and [head_native],
                                 dtype)  # fmt: skip
    if isinstance(head_q, quant.QMatrix):
        head_blocks = [head_q]  # the kernel takes a wide matrix in one call
    else:
        head = head_of()
        # A large vocabulary is split into column blocks: XLA's CPU matmul slows down several
        # times over a very wide right-hand side (such as the default model's 49,152 columns).
        step = HEAD_BLOCK if cfg.vocab_size > 2 * HEAD_BLOCK else cfg.vocab_size
        head_blocks = [jnp.asarray(np.ascontiguousarray(head[:, i:i + step]), dtype)
                       for i in range(0, cfg.vocab_size, step)]
    return {
        "embed": jnp.asarray(w["embed"], dtype),  # [vocab, hidden]: rows looked up, not multiplied
        "layers": layers,
        "final_norm": f32(w["final_norm"]),  # [hidden]
        # [hidden, <= step] blocks, materialised (and contiguous) even when tied, or one QMatrix
        "head": head_blocks,
    }
