"""Prefill continuation: the prompt pass over tokens m.. of a prompt whose first m tokens' K/V are
already known (a prefix cache hit), in JAX.

It is prefill_hidden (llama_model.py) for one sequence with two differences: the new tokens sit
at positions m, m + 1, ... (their RoPE angles and the causal mask start there), and each layer's
attention runs over the cached K/V followed by the new tokens' own. The cached K/V are what a
prefill stored: K after RoPE, so they are used as they are. Traced inside jit by the engine
(splitserve/engine/jax/prefix_reuse.py), one program per (cached bucket, new bucket).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from splitserve.engine.model import llama_model as lm
from splitserve.engine.model.llama_config import LlamaConfig


def continue_hidden(cfg: LlamaConfig, params: dict, cached_k, cached_v, cached_len, tokens):
    """cached_k, cached_v [layers, C, KV, D] (positions >= cached_len are padding), cached_len
    int32 scalar, tokens [T] int32 (padded after the real ones) -> the residual stream x
    [T, hidden] and the new tokens' k, v [layers, T, KV, D] float32."""
    t, c = tokens.shape[0], cached_k.shape[1]
    kv, g, d = cfg.kv_heads, cfg.group, cfg.head_dim
    x = params["embed"][tokens].astype(jnp.float32)  # [T, hidden]
    cos, sin = lm.rope_angles(cfg, cached_len + jnp.arange(t))  # [T, D/2]
    # [G * T(query), C + T(key)]: every real cached position, then the new ones causally
    old = jnp.broadcast_to(jnp.arange(c)[None, :] < cached_len, (t, c))
    visible = jnp.tile(jnp.concatenate([old, jnp.tril(jnp.ones((t, t), bool))], axis=1), (g, 1))
    scale = 1.0 / np.sqrt(d)
    ks, vs = [], []
    for layer, lw in enumerate(params["layers"]):
        h = lm.rms_norm(x, lw["attn_norm"], cfg.rms_eps)
        q, k, v = lm._split_qkv(cfg, lm._matmul(h, lw["wqkv"]))  # q [T, H, D], k, v [T, KV, D]
        q, k = lm.apply_rope(q, cos, sin), lm.apply_rope(k, cos, sin)
        ks.append(k)
        vs.append(v)
        keys = jnp.concatenate([cached_k[layer].astype(jnp.float32), k], axis=0)  # [C+T, KV, D]
        vals = jnp.concatenate([cached_v[layer].astype(jnp.float32), v], axis=0)
        # heads first, as prefill_hidden: plain batched matmuls over the KV heads
        qh = q.reshape(t, kv, g, d).transpose(1, 2, 0, 3).reshape(kv, g * t, d)
        scores = jnp.matmul(qh, keys.transpose(1, 2, 0)) * scale  # [KV, G*T, C+T]
        probs = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
        o = jnp.matmul(probs, vals.transpose(1, 0, 2))  # [KV, G*T, D]
        o = o.reshape(kv, g, t, d).transpose(2, 0, 1, 3)  # [T, KV, G, D]
        x = x + lm._matmul(o.reshape(t, cfg.heads * d), lw["wo"])
        x = x + lm._mlp(cfg, lw, lm.rms_norm(x, lw["ffn_norm"], cfg.rms_eps))
    return x, jnp.stack(ks), jnp.stack(vs)


def prefill_continue_fn(cfg, params, cached_k, cached_v, cached_len, tokens, length):
    """-> (logits [1, vocab] at the last real new token, k, v [layers, T, KV, D])."""
    x, k, v = continue_hidden(cfg, params, cached_k, cached_v, cached_len, tokens)
    last = jax.lax.dynamic_slice_in_dim(x, length - 1, 1, axis=0)  # [1, hidden]
    return lm._logits(cfg, params, last), k, v


def continue_shapes(buckets: tuple[int, ...], max_seq_len: int) -> list[tuple[int, int]]:
    """(cached bucket, new bucket) pairs some prompt of at most max_seq_len tokens needs: the
    smallest cached length a bucket serves (one more than the bucket below) plus the smallest
    new length must fit."""
    below = (0, *buckets[:-1])
    return [(c, t) for i, c in enumerate(buckets) for j, t in enumerate(buckets)
            if below[i] + 1 + below[j] + 1 <= max_seq_len]  # fmt: skip
