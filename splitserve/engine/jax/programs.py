"""The functions the JAX engine compiles, one program per shape (program_specs.py lowers them).

Host-side inputs of a step travel packed: one int32 array [6, rows] (INT_ROWS) and one float32
array [2, rows] (FLOAT_ROWS), one host->device copy each instead of seven; `sampling_rows`
packs one request's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax import controls
from splitserve.engine.jax import sampling as sampler
from splitserve.engine.model import llama_model

# Rows of the packed per-step int32 input.
# LIVE: the live rows of the step (the same in every column; they are packed at the front).
TOKEN, POS, OUT_POS, TOP_K, SEED, LIVE = range(6)
INT_ROWS = 6
# Rows of the packed per-step float32 input.
TEMP, TOP_P = range(2)
FLOAT_ROWS = 2


def sampling_rows(sp: SamplingParams, out_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """One slot's packed sampling inputs: ints [INT_ROWS, 1], floats [FLOAT_ROWS, 1]."""
    if sp.temperature < 0 or not 0.0 < sp.top_p <= 1.0 or sp.top_k < 0:
        raise ValueError(f"invalid sampling parameters {sp}")
    ints = np.zeros((INT_ROWS, 1), np.int32)
    ints[OUT_POS] = out_pos
    ints[TOP_K] = sp.top_k
    ints[SEED] = np.uint32(sp.seed & 0xFFFFFFFF).view(np.int32)
    floats = np.array([[sp.temperature], [sp.top_p]], np.float32)
    return ints, floats


def prefill_fn(cfg, attention, params, tokens, lengths):
    """tokens [N, T] padded, lengths [N] -> logits [N, vocab], k, v [N, layers, T, KV, D]."""
    return llama_model.prefill(cfg, params, tokens, lengths, attention)


def sample_fn(greedy_only, logits, ints, floats):
    """logits [rows, vocab] -> (tokens [rows], logprobs [rows]), each row by its own params."""
    if greedy_only:
        return sampler.greedy(logits)
    seeds = lax.bitcast_convert_type(ints[SEED], jnp.uint32)
    return sampler.sample(logits, floats[TEMP], ints[TOP_K], floats[TOP_P], seeds, ints[OUT_POS])


def controls_fn(logits, ints, floats, cfloats, flags, allowed, bias_ids, bias_vals, banned,
                hist=None):  # fmt: skip
    """Rows with logits controls or a grammar mask (controls.py): (tokens, logprobs, top ids,
    top logprobs). `hist` is given only by the variant whose rows have penalties."""
    seeds = lax.bitcast_convert_type(ints[SEED], jnp.uint32)
    return controls.process(
        logits, floats[TEMP], ints[TOP_K], floats[TOP_P], seeds, ints[OUT_POS], cfloats, flags,
        allowed, bias_ids, bias_vals, banned, hist,
    )


def gather_fn(logits, rows):
    """logits [batch, V] -> [len(rows), V]: the rows the controls program runs on, so that it
    costs the controlled rows, not the batch."""
    return jnp.take(logits, rows, axis=0)


def prompt_fn(cfg, params, tokens):
    """One padded prompt [T] -> its prompt logprobs (controls.prompt_scores)."""
    return controls.prompt_scores(llama_model.forward(cfg, params, tokens), tokens)


def decode_fn(cfg, attention, params, cache_k, cache_v, ints):
    """One step over rows [0, b) (b = ints.shape[1]). Greedy picks are fused in (the common
    case needs nothing else); the logits come back too, for the separate sampling program
    when some row samples."""
    logits, cache_k, cache_v = llama_model.decode(
        cfg, params, cache_k, cache_v, ints[TOKEN], ints[POS], attention, jnp.max(ints[LIVE])
    )
    tokens, logprobs = sampler.greedy(logits)
    return cache_k, cache_v, tokens, logprobs, logits


def decode_steps_fn(cfg, attention, steps, params, cache_k, cache_v, ints, floats):
    """`steps` decode steps in one program, each row's token feeding its next step: one
    dispatch instead of `steps`. Sampling runs inside (only when some row samples: a cond, so
    greedy batches skip it). Positions stop at the cache's last one, inside each row's own
    space, as the host clamps them for single steps.
    Returns (cache_k, cache_v, tokens [steps, b], logprobs [steps, b])."""
    capacity = cache_v[0].shape[2]
    hot = jnp.any(floats[TEMP] > 0)

    def step(carry, _):
        cache_k, cache_v, ints = carry
        logits, cache_k, cache_v = llama_model.decode(
            cfg, params, cache_k, cache_v, ints[TOKEN], ints[POS], attention,
            jnp.max(ints[LIVE]),
        )
        tokens, logprobs = lax.cond(
            hot,
            lambda lg: sample_fn(False, lg, ints, floats),
            lambda lg: sampler.greedy(lg),
            logits,
        )
        ints = ints.at[TOKEN].set(tokens)
        ints = ints.at[POS].set(jnp.minimum(ints[POS] + 1, capacity - 1))
        ints = ints.at[OUT_POS].add(1)
        return (cache_k, cache_v, ints), (tokens, logprobs)

    (cache_k, cache_v, _), (tokens, logprobs) = lax.scan(
        step, (cache_k, cache_v, ints), None, length=steps
    )
    return cache_k, cache_v, tokens, logprobs


def insert_fn(ck, cv, k, v, row):
    """One layer: k, v [width, kv_heads, head_dim] -> positions [0, width) of one row.

    Per layer rather than all layers at once: the same small program serves every layer,
    so the (width, capacity) pairs cost little to compile even for deep models.
    ck: [rows, KV, D, capacity] (keys transposed); cv: [rows, KV, capacity, D].
    """
    kt = jnp.transpose(k, (1, 2, 0))[None]  # [1, KV, D, width]
    vt = jnp.transpose(v, (1, 0, 2))[None]  # [1, KV, width, D]
    ck = lax.dynamic_update_slice(ck, kt.astype(ck.dtype), (row, 0, 0, 0))
    cv = lax.dynamic_update_slice(cv, vt.astype(cv.dtype), (row, 0, 0, 0))
    return ck, cv


def move_fn(cache_k, cache_v, src, dst):
    """Every layer's row `src` copied to row `dst` (compaction: a live slot leaves a row the
    next, smaller batch bucket no longer covers)."""

    def move(a):
        row = lax.dynamic_slice_in_dim(a, src, 1, axis=0)
        return lax.dynamic_update_slice_in_dim(a, row, dst, axis=0)

    return [move(a) for a in cache_k], [move(a) for a in cache_v]


def resize_fn(capacity, ck, cv):
    """One layer's caches copied to another capacity: positions beyond it are dropped (no
    live slot uses them), new positions are zero."""

    def fit(a, axis):
        keep = min(a.shape[axis], capacity)
        a = lax.slice_in_dim(a, 0, keep, axis=axis)
        pad = [(0, 0, 0)] * a.ndim
        pad[axis] = (0, capacity - keep, 0)
        return lax.pad(a, jnp.zeros((), a.dtype), pad)

    return fit(ck, 3), fit(cv, 2)


def jit_decode(cfg, steps: int, attention: str = "xla"):
    """The decode program's jitted function for `steps` steps (caches donated)."""
    from functools import partial

    if steps == 1:
        return jax.jit(partial(decode_fn, cfg, attention), donate_argnums=(1, 2))
    return jax.jit(partial(decode_steps_fn, cfg, attention, steps), donate_argnums=(1, 2))
