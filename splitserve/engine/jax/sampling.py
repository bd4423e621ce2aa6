"""Per-slot token sampling inside jit: greedy, temperature, top-k, top-p, per-request seed.

Two variants, chosen by the engine per step:
- `greedy`: argmax only. The common case, and the one that must stay cheap.
- `sample`: every slot with its own temperature / top-k / top-p / seed (temperature 0
  slots still get argmax). No vocabulary sort: the k-th largest logit and the top-p
  probability threshold are found exactly by a 32-step bitwise search over the float's
  ordered integer bits (O(32 * vocab) compares; XLA's sort, top_k and cumsum are all far
  slower on CPU), and the token is drawn by inverse CDF from one uniform number, with
  prefix sums done as small triangular matmuls.

Reproducibility: a slot's draw at output position i uses key fold_in(PRNGKey(seed), i) and
nothing else, so the token depends only on (seed, i, logits, params), never on the batch
or the slot. Seeds are taken modulo 2**32.
Log-probabilities are vLLM's processed logprobs, the one convention of every path (the controls
program's too, controls.py): the log-probability of the chosen token in the distribution it was
drawn from, after temperature, top-k and top-p; a greedy row's are of its logits as they are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _argmax_and_logsumexp(logits, block: int = 64):
    """logits [S, V] -> (first index of the row maximum [S] int32, logsumexp [S]).

    Two levels: a plain max over blocks of 64 (a fast vectorised reduction on CPU), then
    argmax over the block maxima and inside the winning block. XLA's one-level argmax is a
    (value, index) reduction that runs several times slower over a whole vocabulary.
    """
    rows, vocab = logits.shape
    pad = (-vocab) % block
    blocks = jnp.pad(logits, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    blocks = blocks.reshape(rows, -1, block)  # [S, nb, block]
    block_max = blocks.max(axis=-1)  # [S, nb]
    best = jnp.argmax(block_max, axis=-1).astype(jnp.int32)  # first block holding the max
    inner = jnp.take_along_axis(blocks, best[:, None, None], axis=1)[:, 0]  # [S, block]
    token = best * block + jnp.argmax(inner, axis=-1).astype(jnp.int32)
    top = block_max.max(axis=-1)
    lse = top + jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=-1))
    return token, lse


def _logprob_of(logits, tokens, lse):
    """log_softmax(logits)[s, tokens[s]] given each row's logsumexp, [S] float32."""
    return jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] - lse


def greedy(logits):
    """logits [S, V] float32 -> (tokens [S] int32, logprobs [S] float32)."""
    tokens, lse = _argmax_and_logsumexp(logits)
    return tokens, _logprob_of(logits, tokens, lse)


def _ordered_bits(x):
    """float32 -> uint32 whose unsigned order equals the floats' order (no NaNs)."""
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    negative = (bits >> 31) == 1
    return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _largest_threshold(keys, accept):
    """Per row, the largest uint32 t with accept(keys >= t) true, built bit by bit.

    keys: [S, V] uint32; accept(mask [S, V]) -> [S] bool must be monotone (true for t=0).
    """

    def body(i, t):
        cand = t | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
        ok = accept(keys >= cand[:, None])
        return jnp.where(ok, cand, t)

    return lax.fori_loop(0, 32, body, jnp.zeros(keys.shape[0], jnp.uint32))


def _top_k_mask(z, top_k):
    """Keep the top_k largest entries per row (ties at the k-th value kept). top_k<=0: all."""
    keys = _ordered_bits(z)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, z.shape[-1]), z.shape[-1])
    thresh = _largest_threshold(keys, lambda m: jnp.sum(m, axis=-1, dtype=jnp.int32) >= k)
    return keys >= thresh[:, None]


def _top_p_mask(probs, top_p):
    """Keep the smallest set of most likely tokens whose mass reaches top_p (>= 1: all)."""
    keys = lax.bitcast_convert_type(probs, jnp.uint32)  # probs >= 0: bits are ordered
    mass = lambda m: jnp.sum(jnp.where(m, probs, 0.0), axis=-1)
    thresh = _largest_threshold(keys, lambda m: mass(m) >= top_p)
    return (keys >= thresh[:, None]) | (top_p >= 1.0)[:, None]


def _uniforms(seeds, positions):
    """seeds [S] uint32, positions [S] int32 -> [S] float32 in [0, 1)."""

    def one(seed, pos):
        return jax.random.uniform(jax.random.fold_in(jax.random.PRNGKey(seed), pos))

    return jax.vmap(one)(seeds, positions)


def _inclusive_prefix(x):
    """Prefix sums along the last axis by a triangular matmul ([n, n] ones), which XLA on CPU
    runs far faster than its cumsum. x: [S, n] -> [S, n]."""
    n = x.shape[-1]
    upper = jnp.triu(jnp.ones((n, n), x.dtype))  # upper[j, i] = 1 when j <= i
    return jnp.dot(x, upper, precision=lax.Precision.HIGHEST)


def _inverse_cdf(probs, u, block: int = 256):
    """Per row, the first index whose cumulative mass exceeds u * total mass.

    probs [S, V] >= 0 (zero = filtered out; never chosen); u [S] in [0, 1).
    Two levels (block masses, then within the chosen block) keep it O(V) with small matmuls.
    """
    rows, vocab = probs.shape
    block = min(block, vocab)
    pad = (-vocab) % block
    blocks = jnp.pad(probs, ((0, 0), (0, pad))).reshape(rows, -1, block)  # [S, nb, block]
    mass = blocks.sum(axis=-1)  # [S, nb]
    cdf = _inclusive_prefix(mass)  # [S, nb]
    target = u * cdf[:, -1]
    nb = mass.shape[-1]
    b = jnp.minimum(jnp.sum(cdf <= target[:, None], axis=-1, dtype=jnp.int32), nb - 1)
    before = jnp.take_along_axis(cdf - mass, b[:, None], axis=-1)  # mass of earlier blocks
    inner = jnp.take_along_axis(blocks, b[:, None, None], axis=1)[:, 0]  # [S, block]
    inner_cdf = before + _inclusive_prefix(inner)
    i = jnp.minimum(jnp.sum(inner_cdf <= target[:, None], axis=-1, dtype=jnp.int32), block - 1)
    # Rounding between the two levels can land on a filtered (zero) entry: take the block's
    # most likely entry instead, so a filtered token is never emitted.
    picked = jnp.take_along_axis(inner, i[:, None], axis=-1)[:, 0]
    i = jnp.where(picked > 0, i, jnp.argmax(inner, axis=-1).astype(jnp.int32))
    return b * block + i


def sample(logits, temperature, top_k, top_p, seeds, positions):
    """Per-slot sampling.

    logits [S, V] float32; temperature [S] float32 (0 = greedy); top_k [S] int32 (0 = off);
    top_p [S] float32 (1 = off); seeds [S] uint32; positions [S] int32 output positions.
    Returns (tokens [S] int32, logprobs [S] float32): a hot row's logprob is its token's in
    the drawn distribution (temperature, then top-k and top-p), a greedy row's its raw one.
    """
    vocab = logits.shape[-1]
    hot = temperature > 0
    z = logits / jnp.where(hot, temperature, 1.0)[:, None]
    # The searches cost 32 passes over the vocabulary; skip them when no slot asks.
    need_k = jnp.any(hot & (top_k > 0) & (top_k < vocab))
    z = lax.cond(need_k, lambda z: jnp.where(_top_k_mask(z, top_k), z, -jnp.inf), lambda z: z, z)
    z_max = jnp.max(z, axis=-1)
    unnormed = jnp.exp(z - z_max[:, None])
    total = jnp.sum(unnormed, axis=-1)
    probs = unnormed / total[:, None]
    need_p = jnp.any(hot & (top_p < 1.0))
    probs = lax.cond(
        need_p, lambda p: jnp.where(_top_p_mask(p, top_p), p, 0.0), lambda p: p, probs
    )
    drawn = _inverse_cdf(probs, _uniforms(seeds, positions))
    best, lse = _argmax_and_logsumexp(logits)
    tokens = jnp.where(hot, drawn, best)
    # the drawn distribution's log-softmax: z minus the logsumexp over the kept tokens, which
    # is z's own logsumexp plus the log of the kept probability mass (1 without top-p)
    z_lse = z_max + jnp.log(total) + jnp.log(jnp.sum(probs, axis=-1))
    hot_lp = jnp.take_along_axis(z, tokens[:, None], axis=-1)[:, 0] - z_lse
    return tokens, jnp.where(hot, hot_lp, _logprob_of(logits, tokens, lse))
