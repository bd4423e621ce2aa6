"""The native decode attention (native/attention.c) equals XLA's (llama_model._attend) on every
instruction set the CPU has, reading only each row's own positions; an engine running it decodes
the same tokens as one running XLA's."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.kernels import qkernel
from splitserve.engine.model import llama_model

pytestmark = pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")


@jax.jit
def _native(q, ck, cv, lengths):
    return qkernel.attention(q, ck, cv, lengths)


@jax.jit
def _xla(q, ck, cv, lengths):
    visible = np.arange(ck.shape[-1])[None, :] < lengths[:, None]
    return llama_model._attend(q, ck[:q.shape[0]], cv[:q.shape[0]], visible[:, None, None, :])


# (rows in the cache, live rows, KV heads, query heads per KV head, head dim, capacity)
SHAPES = [(4, 4, 2, 2, 16, 64), (6, 3, 3, 3, 64, 80), (2, 1, 1, 5, 32, 17), (3, 2, 2, 1, 24, 40)]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_native_attention_equals_xla(isa, shape):
    rows, n, kv, g, d, c = shape
    rng = np.random.default_rng(sum(shape))
    q = rng.standard_normal((n, kv, g, d)).astype(np.float32) * 0.5
    ck = rng.standard_normal((rows, kv, d, c)).astype(np.float32)
    cv = rng.standard_normal((rows, kv, c, d)).astype(np.float32)
    lengths = np.array([1, c, *rng.integers(1, c + 1, n)][:n], np.int32)
    want = np.asarray(_xla(q, ck, cv, lengths))
    got = np.asarray(_native(q, ck, cv, lengths))
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=2e-5)
    # positions at and past a row's length are never read: junk there changes nothing
    ck2, cv2 = ck.copy(), cv.copy()
    for r, length in enumerate(lengths):
        ck2[r, :, :, length:] = np.nan
        cv2[r, :, length:] = np.nan
    ck2[n:], cv2[n:] = np.nan, np.nan
    np.testing.assert_array_equal(np.asarray(_native(q, ck2, cv2, lengths)), got)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=3)],
                         ids=["greedy", "seeded"])
def test_engine_with_native_attention_decodes_as_with_xla(sampling):
    def tokens(attention):
        eng = build_jax_engine("random:test-tiny:4", 3, 64, prefill_buckets=(16, 64),
                               decode_buckets=(32, 64), attention=attention)
        prompts = [[int(t) for t in np.random.default_rng(s).integers(1, 512, 5 + 9 * s)]
                   for s in range(3)]
        for s, p in enumerate(prompts):
            eng.insert(eng.prefill(p, sampling), s, sampling)
        return np.stack([eng.generate().tokens for _ in range(30)])

    np.testing.assert_array_equal(tokens("native"), tokens("xla"))
