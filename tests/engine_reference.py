"""A textbook Llama forward pass in plain numpy, for checking the JAX engine and its loaders.

Independent of splitserve's engine on purpose: it shares no code with it, takes weights in
Hugging Face naming and orientation (torch Linear: [out, in]), and does everything the slow
obvious way (float64, explicit repeat of KV heads for grouped-query attention, rotary
embedding on the two halves of each head as Hugging Face does).
"""

from __future__ import annotations

import numpy as np


def random_hf_weights(
    rng: np.random.Generator,
    vocab: int,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tied: bool,
) -> dict[str, np.ndarray]:
    """Random float32 weights under Hugging Face Llama names."""

    def lin(out_dim: int, in_dim: int) -> np.ndarray:
        return (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, hidden)).astype(np.float32)
        * np.float32(2.0 / np.sqrt(hidden))
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "self_attn.q_proj.weight"] = lin(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = lin(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = lin(kv_heads * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = lin(hidden, heads * head_dim)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "mlp.gate_proj.weight"] = lin(intermediate, hidden)
        w[p + "mlp.up_proj.weight"] = lin(intermediate, hidden)
        w[p + "mlp.down_proj.weight"] = lin(hidden, intermediate)
    w["model.norm.weight"] = norm(hidden)
    if not tied:
        w["lm_head.weight"] = 2.0 * lin(vocab, hidden)
    return w


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rope(x: np.ndarray, theta: float) -> np.ndarray:
    """x: [T, heads, head_dim]; rotate pairs (i, i + head_dim/2) by angle pos * theta^(-2i/d)."""
    t, _, d = x.shape
    half = d // 2
    freqs = theta ** (-np.arange(half) * 2.0 / d)
    angle = np.arange(t)[:, None] * freqs[None, :]  # [T, half]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def reference_logits(
    w: dict[str, np.ndarray],
    tokens: list[int],
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    rope_theta: float,
    rms_eps: float,
) -> np.ndarray:
    """Logits [T, vocab] (float64) for a token sequence under HF-named weights w."""
    g = {k: v.astype(np.float64) for k, v in w.items()}
    x = g["model.embed_tokens.weight"][np.asarray(tokens)]  # [T, hidden]
    t = len(tokens)
    mask = np.tril(np.ones((t, t), bool))
    for i in range(layers):
        p = f"model.layers.{i}."
        h = _rms_norm(x, g[p + "input_layernorm.weight"], rms_eps)
        q = (h @ g[p + "self_attn.q_proj.weight"].T).reshape(t, heads, head_dim)
        k = (h @ g[p + "self_attn.k_proj.weight"].T).reshape(t, kv_heads, head_dim)
        v = (h @ g[p + "self_attn.v_proj.weight"].T).reshape(t, kv_heads, head_dim)
        q, k = _rope(q, rope_theta), _rope(k, rope_theta)
        rep = heads // kv_heads
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # [T, heads, D]
        out = np.zeros((t, heads, head_dim))
        for hd in range(heads):
            s = q[:, hd] @ k[:, hd].T / np.sqrt(head_dim)  # [T, T]
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, hd] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, hd]
        x = x + out.reshape(t, heads * head_dim) @ g[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, g[p + "post_attention_layernorm.weight"], rms_eps)
        gate = h @ g[p + "mlp.gate_proj.weight"].T
        up = h @ g[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ g[p + "mlp.down_proj.weight"].T
    x = _rms_norm(x, g["model.norm.weight"], rms_eps)
    head = g.get("lm_head.weight", g["model.embed_tokens.weight"])
    return x @ head.T
