"""Per-request logits processing inside jit, in the order the engine contract gives
(engine/interface.py):
grammar mask, bad words, logit bias, penalties, temperature, min-p / top-k / top-p, the token.

One program over the controlled rows of a decode step (gathered from the batch's logits on the
device, padded to a count bucket: controlled.py) or one prompt (prefill), only when some
live row has controls or a mask: a batch without any runs the plain programs, untouched, and
the plain rows of a batch with some keep the plain programs' results. Every input is an array
indexed by row:

- ints / floats: the packed sampling rows of programs.py (token, position, seed, ...);
- cfloats [CF_ROWS, b]: repetition, frequency and presence penalties, min-p;
- flags [FLAG_ROWS, b] int32: the row's top-logprob count;
- allowed [b, W] int32: packed allowed-token bits (llguidance's layout; -1 words for a row
  without a grammar);
- bias_ids / bias_vals [b, MAX_LOGIT_BIAS]: sparse logit bias, padded with id V (dropped);
- banned [b, MAX_BAD_WORDS]: the tokens bad words forbid this step (host-matched), pad V;
- hist [b, V] int32 (only in the `history` variant): 2 x the token's count in the output, plus
  1 when the prompt holds it: counts for frequency / presence, "seen" for repetition.

Sampling reuses sampling.py's pieces in the same sequence as sampling.sample, so a row with
neutral controls draws the very token the plain path draws (same seed, same position).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from splitserve.engine.interface import MAX_TOP_LOGPROBS
from splitserve.engine.jax import sampling as sampler

REP, FREQ, PRES, MIN_P = range(4)
CF_ROWS = 4
TOP_K_LOGPROBS = 0
FLAG_ROWS = 1


def unpack_allowed(bits, vocab: int):
    """[b, W] int32 packed rows -> [b, vocab] bool (bit j of word w: token 32w + j)."""
    words = lax.bitcast_convert_type(bits, jnp.uint32)
    shifts = jnp.arange(32, dtype=jnp.uint32)
    unpacked = (words[:, :, None] >> shifts) & jnp.uint32(1)
    return unpacked.reshape(bits.shape[0], -1)[:, :vocab] == 1


def _log_softmax(z):
    """Rows may hold -inf (filtered tokens), never only -inf."""
    top = jnp.max(z, axis=-1, keepdims=True)
    return z - (top + jnp.log(jnp.sum(jnp.exp(z - top), axis=-1, keepdims=True)))


def _before_temperature(logits, cfloats, allowed, bias_ids, bias_vals, banned, hist):
    """Steps 1-4 on [b, V] logits."""
    b, vocab = logits.shape
    rows = jnp.arange(b)[:, None]
    z = jnp.where(unpack_allowed(allowed, vocab), logits, -jnp.inf)
    # bad words are dropped for a row they would leave without a token (as the fake engine)
    without = z.at[rows, banned].set(-jnp.inf, mode="drop")
    z = jnp.where(jnp.any(jnp.isfinite(without), axis=-1, keepdims=True), without, z)
    z = z.at[rows, bias_ids].add(bias_vals, mode="drop")
    if hist is not None:
        rep = cfloats[REP][:, None]
        count = (hist >> 1).astype(jnp.float32)
        z = jnp.where(hist > 0, jnp.where(z > 0, z / rep, z * rep), z)
        z = z - cfloats[FREQ][:, None] * count - cfloats[PRES][:, None] * (count > 0)
    return z


def _draw(z, temperature, top_k, top_p, min_p, seeds, positions):
    """Steps 5-7 for the hot rows, as sampling.sample does them (plus min-p, off when 0).
    Returns (drawn tokens [b], processed z [b, V] with -inf where filtered)."""
    vocab = z.shape[-1]
    hot = temperature > 0
    z = z / jnp.where(hot, temperature, 1.0)[:, None]
    need_min_p = jnp.any(hot & (min_p > 0))

    def cut_min_p(z):  # probability >= min_p x the largest: exp(z - max) >= min_p
        keep = jnp.exp(z - jnp.max(z, axis=-1, keepdims=True)) >= min_p[:, None]
        return jnp.where(keep | (min_p <= 0)[:, None], z, -jnp.inf)

    z = lax.cond(need_min_p, cut_min_p, lambda z: z, z)
    need_k = jnp.any(hot & (top_k > 0) & (top_k < vocab))
    z = lax.cond(
        need_k, lambda z: jnp.where(sampler._top_k_mask(z, top_k), z, -jnp.inf), lambda z: z, z
    )
    probs = jnp.exp(z - jnp.max(z, axis=-1, keepdims=True))
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    need_p = jnp.any(hot & (top_p < 1.0))
    keep_p = lax.cond(
        need_p, lambda p: sampler._top_p_mask(p, top_p), lambda p: jnp.ones(p.shape, bool), probs
    )
    probs = jnp.where(keep_p, probs, 0.0)
    drawn = sampler._inverse_cdf(probs, sampler._uniforms(seeds, positions))
    return drawn, jnp.where(keep_p, z, -jnp.inf)


def process(logits, temperature, top_k, top_p, seeds, positions, cfloats, flags, allowed,
            bias_ids, bias_vals, banned, hist=None):  # fmt: skip
    """The whole order on [b, V] logits. Returns (tokens [b], logprobs [b], top ids [b, 20],
    top logprobs [b, 20]). Logprobs are log_softmax of the logits after steps 1-6 (1-4 when
    greedy): vLLM's processed logprobs, the plain sampler's convention too (sampling.py), so a
    row with neutral controls gets the plain path's logprobs."""
    hot = temperature > 0
    z = _before_temperature(logits, cfloats, allowed, bias_ids, bias_vals, banned, hist)
    need_draw = jnp.any(hot)
    drawn, z_hot = lax.cond(
        need_draw,
        lambda z: _draw(z, temperature, top_k, top_p, cfloats[MIN_P], seeds, positions),
        lambda z: (jnp.zeros(z.shape[0], jnp.int32), z),
        z,
    )
    z = jnp.where(hot[:, None], z_hot, z)
    best, _ = sampler._argmax_and_logsumexp(z)
    tokens = jnp.where(hot, drawn, best)
    logp = _log_softmax(z)
    logprobs = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    k = min(MAX_TOP_LOGPROBS, logits.shape[-1])
    top_lp, top_ids = lax.cond(
        jnp.any(flags[TOP_K_LOGPROBS] > 0),
        lambda lp: tuple(lax.top_k(lp, k)),
        lambda lp: (jnp.zeros((lp.shape[0], k), lp.dtype), jnp.zeros((lp.shape[0], k), jnp.int32)),
        logp,
    )
    return tokens, logprobs, top_ids.astype(jnp.int32), top_lp


def prompt_scores(logits, tokens):
    """Prompt logprobs of one padded prompt: logits [T, V] of every position, tokens [T].
    Returns, for i = 1..T-1: log P(tokens[i] | tokens[:i]) [T-1], its rank (1 + how many
    tokens were more likely) [T-1], and the top ids / logprobs [T-1, 20] (raw logits)."""
    logp = jax.nn.log_softmax(logits[:-1].astype(jnp.float32), axis=-1)
    target = tokens[1:]
    lp = jnp.take_along_axis(logp, target[:, None], axis=-1)[:, 0]
    ranks = 1 + jnp.sum(logp > lp[:, None], axis=-1, dtype=jnp.int32)
    top_lp, top_ids = lax.top_k(logp, min(MAX_TOP_LOGPROBS, logits.shape[-1]))
    return lp, ranks, top_ids.astype(jnp.int32), top_lp
