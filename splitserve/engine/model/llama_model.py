"""Llama decoder math in JAX: pure functions over a weights pytree.

Loaders (GGUF, Hugging Face, random) all produce the same *canonical* numpy weights, with
matrices stored [in, out] so that a layer is `x @ w`, layers stacked on a leading axis, and
the rotary layout of Hugging Face (each head's dimensions split into two halves, not
interleaved pairs):

    embed      [vocab, hidden]
    attn_norm  [layers, hidden]
    wq         [layers, hidden, heads * head_dim]
    wk, wv     [layers, hidden, kv_heads * head_dim]
    wo         [layers, heads * head_dim, hidden]
    ffn_norm   [layers, hidden]
    w_gate     [layers, hidden, intermediate]
    w_up       [layers, hidden, intermediate]
    w_down     [layers, intermediate, hidden]
    final_norm [hidden]
    head       [hidden, vocab]   (absent when the embedding is tied)

params.py turns them into the compute pytree once (prepare_params). Every function below is
traced inside jit by the engine.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from splitserve.engine.kernels import qkernel, quant
from splitserve.engine.model.llama_config import LlamaConfig


def rms_norm(x, weight, eps: float):
    """x: [..., hidden]; statistics in float32 whatever x's dtype."""
    x32 = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return x32 * inv * weight


def rope_angles(cfg: LlamaConfig, positions):
    """positions: [...] int -> (cos, sin) each [..., head_dim // 2], float32."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(half, dtype=np.float64) * 2.0 / cfg.head_dim))
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """x: [..., heads, head_dim]; cos, sin: [..., head_dim // 2] (broadcast over heads)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[..., None, :], sin[..., None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _split_qkv(cfg: LlamaConfig, qkv):
    """qkv: [..., (heads + 2 kv_heads) * head_dim] -> q [..., H, D], k, v [..., KV, D]."""
    d, nq, nk = cfg.head_dim, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    lead = qkv.shape[:-1]
    q = qkv[..., :nq].reshape(*lead, cfg.heads, d)
    k = qkv[..., nq:nq + nk].reshape(*lead, cfg.kv_heads, d)
    v = qkv[..., nq + nk:].reshape(*lead, cfg.kv_heads, d)
    return q, k, v


def _mlp(cfg: LlamaConfig, lw: dict, x, rows=None):
    """SwiGLU: down(silu(gate(x)) * up(x)). x: [..., hidden] (already normed)."""
    gu = _matmul(x, lw["w_gate_up"], rows)  # [..., 2 * intermediate]
    gate, up = gu[..., :cfg.intermediate], gu[..., cfg.intermediate:]
    return _matmul(jax.nn.silu(gate) * up, lw["w_down"], rows)


def _matmul(x, w, rows=None):
    """x [..., in] float32 @ w [in, out] -> float32. A QMatrix runs in the native kernel
    (kernels/quant.py), which with `rows` (a traced count) computes only the leading rows of x and
    zeroes the rest; XLA's matmul computes them all, in bfloat16 for a Bf16Products; a
    PackedBf16 runs in the kernel's bfloat16 units (the same numbers as a Bf16Products). Other
    bfloat16 XLA weights (param_dtype) are widened first: CPUs without bfloat16 arithmetic
    multiply float32 far faster."""
    if isinstance(w, quant.QMatrix):
        return quant.matmul(x, w, rows)
    if isinstance(w, quant.Bf16Products):
        return quant.bf16_products(x, w)
    if isinstance(w, quant.PackedBf16):
        return quant.packed_bf16_products(x, w)
    return jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32))


def _scores(qg, ck):
    """q.K for every cached position: qg [S, KV, G, D], ck [S, KV, D, C] -> [S, KV, G, C].

    Written as D multiply-adds of [S, KV, G, C] planes, which XLA fuses into one loop over the
    output that reads each key row along C. The same sum as a reduction over D (or as a batched
    matmul of this skinny shape) compiles to a loop that walks down D, slower on CPU, and the
    decode step of many slots over long caches was faster this way.
    """
    scores = qg[:, :, :, 0, None] * ck[:, :, None, 0, :].astype(jnp.float32)
    for d in range(1, qg.shape[3]):
        scores = scores + qg[:, :, :, d, None] * ck[:, :, None, d, :].astype(jnp.float32)
    return scores


def _attend(qg, ck, cv, visible):
    """XLA's decode attention: qg [n, KV, G, D] (scaled), ck [n, KV, D, C], cv [n, KV, C, D],
    visible [n, 1, 1, C] -> [n, KV, G, D]."""
    scores = _scores(qg, ck)  # [n, KV, G, C]
    scores = jnp.where(visible, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    # p.V as multiply-and-reduce over C, one pass over the cache (a batched matmul of this shape
    # is slower on CPU). The barrier keeps XLA from fusing it into the wo matmul, which
    # turns both into one reduction far slower than the matmul.
    probs = jax.lax.optimization_barrier(probs)
    return jnp.sum(probs[..., None] * cv[:, :, None].astype(jnp.float32), axis=3)


def _logits(cfg: LlamaConfig, params: dict, x, rows=None):
    """x: [..., hidden] residual stream -> [..., vocab] float32 logits."""
    h = rms_norm(x, params["final_norm"], cfg.rms_eps)
    blocks = [_matmul(h, block, rows) for block in params["head"]]
    return blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks, axis=-1)


def prefill_hidden(cfg: LlamaConfig, params: dict, tokens, attention: str = "xla"):
    """The prompt pass over one sequence or a batch of them.

    tokens: [T] or [N, T] int32 (padded buckets; padding sits after the real tokens, and the
    causal mask keeps it from influencing them). Returns the residual stream x [(N,) T, hidden]
    and the KV cache k, v each [(N,) layers, T, kv_heads, head_dim] float32. The sequences of a
    batch never see each other: every product but the matmuls with weights is per sequence.
    attention: "xla" (batched products over the KV heads, below) or "native"
    (native/attention.c: each position reads its sequence's keys up to itself, the query heads
    left where the QKV product puts them).
    """
    single = tokens.ndim == 1
    tokens = tokens[None] if single else tokens
    n, t = tokens.shape
    kv, g, d = cfg.kv_heads, cfg.group, cfg.head_dim
    x = params["embed"][tokens].astype(jnp.float32)  # [N, T, hidden]
    # [T, D/2], computed while tracing and held as constants: left to XLA, the cosines and
    # sines were fused into each layer's rotation and computed again there, for every head
    # (lab/benchmarks.md, "Prefill on the tiles")
    with jax.ensure_compile_time_eval():
        cos, sin = rope_angles(cfg, jnp.arange(t))
    scale = 1.0 / np.sqrt(d)
    ks, vs = [], []
    for lw in params["layers"]:
        h = rms_norm(x, lw["attn_norm"], cfg.rms_eps)
        q, k, v = _split_qkv(cfg, _matmul(h, lw["wqkv"]))  # q [N, T, H, D], k, v [N, T, KV, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        ks.append(k)
        vs.append(v)
        if attention == "native":
            kt, vt = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # as the decode cache
            o = qkernel.prompt_attention((q * scale).reshape(n, t, kv, g, d), kt, vt)
        else:
            o = _prompt_attention_xla(q, k, v, scale)  # [N, T, KV, G, D]
        x = x + _matmul(o.reshape(n, t, cfg.heads * d), lw["wo"])
        x = x + _mlp(cfg, lw, rms_norm(x, lw["ffn_norm"], cfg.rms_eps))
    k_all, v_all = jnp.stack(ks, axis=1), jnp.stack(vs, axis=1)  # [N, layers, T, KV, D]
    if single:
        return x[0], k_all[0], v_all[0]
    return x, k_all, v_all


def _prompt_attention_xla(q, k, v, scale):
    """q [N, T, H, D], k, v [N, T, KV, D] -> [N, T, KV, G, D], causal. Heads first, so that both
    products are plain batched matmuls over the KV heads: the prefill is faster on CPU than
    with einsums over [T, KV, G, D], the more so the longer the prompt."""
    n, t, kv, d = k.shape
    g = q.shape[2] // kv
    # [G * T(query), T(key)]: the rows of a KV head's group of query heads, one after another
    causal = jnp.tile(jnp.tril(jnp.ones((t, t), bool)), (g, 1))
    qh = q.reshape(n, t, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(n, kv, g * t, d)
    scores = jnp.matmul(qh, k.transpose(0, 2, 3, 1)) * scale  # [N, KV, G*T, T]
    scores = jnp.where(causal, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    o = jnp.matmul(probs, v.transpose(0, 2, 1, 3))  # [N, KV, G*T, D]
    return o.reshape(n, kv, g, t, d).transpose(0, 3, 1, 2, 4)


def forward(cfg: LlamaConfig, params: dict, tokens):
    """Logits at every position: tokens [T] -> [T, vocab]. For tests and scoring."""
    x, _, _ = prefill_hidden(cfg, params, tokens)
    return _logits(cfg, params, x)


def prefill(cfg: LlamaConfig, params: dict, tokens, lengths, attention: str = "xla"):
    """tokens [N, T] (padded), lengths [N] real tokens -> (logits [N, vocab] at each
    sequence's last real token, k, v [N, layers, T, kv_heads, head_dim])."""
    x, k, v = prefill_hidden(cfg, params, tokens, attention)  # x [N, T, hidden]
    last = jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [N, hidden]
    return _logits(cfg, params, last), k, v


def _write_rows(cache, new, positions, axis: int):
    """cache[r, :, ..., positions[r], ...] = new[r] for rows r < n, in place (axis: where the
    positions run). A scatter, never a dynamic-update-slice: XLA turns a one-row scatter into
    one and fuses it into the loop that then reads the live rows, which recomputes the write
    from the old buffer; that buffer must then outlive the in-place write, so XLA copied the
    whole cache twice per layer and step (a 16-row cache cost far more than a 1-row one with
    one row live). One row is therefore written twice (the same value: the result is the
    same), which keeps it a scatter."""
    n = new.shape[0]
    rows = jnp.arange(n)
    if n == 1:
        rows, positions, new = (jnp.concatenate([a, a]) for a in (rows, positions, new))
    index = [rows] + [slice(None)] * (axis - 1) + [positions]
    return cache.at[tuple(index)].set(new.astype(cache.dtype), mode="promise_in_bounds")


def decode(
    cfg: LlamaConfig, params: dict, cache_k: list, cache_v: list, tokens, positions,
    attention: str = "xla", live=None,
):
    """One token for each of the first n rows of the cache (n = len(tokens)).

    cache_k: per layer [rows, kv_heads, head_dim, capacity] (keys stored transposed, so
             q.K reads each key row along the capacity: see _scores);
    cache_v: per layer [rows, kv_heads, capacity, head_dim]; rows >= n.
    The engine keeps the live slots packed in rows [0, n) with n the smallest batch bucket
    that holds them, so a step costs what is live: the rows beyond n are neither read nor
    written. Attention covers the whole capacity, which the engine keeps at the smallest
    bucket that holds the longest live sequence, so a step costs what the sequences need.
    tokens: [n] int32 input token; positions: [n] int32 where it goes (< capacity).
    attention: "xla" (the loops below) or "native" (native/attention.c: reads each row's
    positions up to its own, not the whole capacity). With native attention, a batch of at
    most FUSED_LAYER_MAX_BATCH rows and every matrix the native kernel's, each layer is one
    call (native/decode_layer.c: one team of threads from the norm to the last residual).
    live: how many leading rows are live (a traced int32; None: all). The native kernel's
    matrix products compute those rows only, so a step with 12 live rows in a 16-row bucket
    costs about what 12 rows cost; the rows after them come out as zeros (padding, never read;
    in a whole-layer call they keep their input and their cache rows are not written).
    Returns (logits [n, vocab] float32, cache_k, cache_v) with the new K/V written.
    """
    n = tokens.shape[0]
    capacity = cache_v[0].shape[2]
    kv, g, d = cfg.kv_heads, cfg.group, cfg.head_dim
    x = params["embed"][tokens].astype(jnp.float32)  # [n, hidden]
    cos, sin = rope_angles(cfg, positions)  # [n, D/2]
    visible = jnp.arange(capacity)[None, :] <= positions[:, None]  # [n, C]
    visible = visible[:, None, None, :]  # [n, 1, 1, C]
    scale = 1.0 / np.sqrt(d)
    lengths = positions + 1  # positions each row attends to, its new one included
    fused = _fused_layer_format(params, n) if attention == "native" else None
    new_k, new_v = [], []
    for lw, ck, cv in zip(params["layers"], cache_k, cache_v, strict=True):
        if fused is not None:
            x, ck, cv = qkernel.decode_layer(
                fused, x, ck, cv, lengths, cos, sin, lw["attn_norm"], lw["ffn_norm"],
                cfg.rms_eps, live, *(lw[m].arrays for m in LAYER_MATRICES),
            )
            new_k.append(ck)
            new_v.append(cv)
            continue
        h = rms_norm(x, lw["attn_norm"], cfg.rms_eps)
        q, k, v = _split_qkv(cfg, _matmul(h, lw["wqkv"], live))  # q [n, H, D], k, v [n, KV, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        ck = _write_rows(ck, k, positions, axis=3)  # [rows, KV, D, C]
        cv = _write_rows(cv, v, positions, axis=2)  # [rows, KV, C, D]
        new_k.append(ck)
        new_v.append(cv)
        qg = (q * scale).reshape(n, kv, g, d)  # [n, KV, G, D]
        if attention == "native":
            o = qkernel.attention(qg, ck, cv, lengths)  # [n, KV, G, D]
        else:
            o = _attend(qg, ck[:n], cv[:n], visible)  # the live rows only
        x = _layer_tail(cfg, lw, x, o.reshape(n, cfg.heads * d), live)
    return _logits(cfg, params, x, live), new_k, new_v


# The largest decode batch whose layer tail runs as one call: on the default model the one
# call made a one-row float32 step shorter, was even at 4 rows and slower at 16.
FUSED_TAIL_MAX_BATCH = 4

# The largest decode batch whose whole layers run as one call each (native/decode_layer.c):
# against the tail alone in one call it shortened the default model's step at every batch
# measured, up to 16 rows, in float32 and in its GGUF blocks (lab/benchmarks.md, "A whole
# layer in one call"); larger batches were not measured.
FUSED_LAYER_MAX_BATCH = 16

# A layer's matrices, in the order native/decode_layer.c takes them.
LAYER_MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")


def _fused_layer_format(params: dict, n: int) -> str | None:
    """The format in which a decode step of n rows runs each whole layer as one native call
    (native/decode_layer.c): where the batch is small and every layer's four matrices are the
    native kernel's, all in one format; else None (the layer runs as its parts, below)."""
    if n > FUSED_LAYER_MAX_BATCH:
        return None
    return _native_format([lw[m] for lw in params["layers"] for m in LAYER_MATRICES])


def _native_format(mats: list) -> str | None:
    """The native kernel's format when every matrix is its QMatrix, all in one format."""
    if not all(isinstance(m, quant.QMatrix) for m in mats):
        return None
    fmts = {m.fmt for m in mats}
    return fmts.pop() if len(fmts) == 1 else None


def _layer_tail(cfg: LlamaConfig, lw: dict, x, attn, live):
    """A decode layer after its attention: the output product and the feed-forward block, each
    with its residual add. Where all three matrices are the native kernel's and the batch is
    small, in one custom call (native/layer_tail.c: one hand-off to the threads instead of
    three, nothing of XLA's between the products); the same values to float32 rounding."""
    mats = (lw["wo"], lw["w_gate_up"], lw["w_down"])
    fmt = _native_format(list(mats)) if x.shape[0] <= FUSED_TAIL_MAX_BATCH else None
    if fmt is not None:
        return qkernel.layer_tail(fmt, x, attn, lw["ffn_norm"], cfg.rms_eps, live,
                                  *(m.arrays for m in mats))  # fmt: skip
    x = x + _matmul(attn, lw["wo"], live)
    return x + _mlp(cfg, lw, rms_norm(x, lw["ffn_norm"], cfg.rms_eps), live)
