"""A prompt pass's attention in the native kernel (native/attention.c, splitserve_prompt_attention)
equals XLA's batched products (llama_model._prompt_attention_xla) on every instruction set the
CPU has, in its blocked AVX-512 path (head_dim 64, up to 4 query heads per KV head) and position
by position elsewhere; the engine takes it only where the blocked path runs, and then prefills
what an engine with XLA's attention prefills."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.kernels import qkernel
from splitserve.engine.model import llama_model

pytestmark = pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")


def _native(q, k, v, scale):
    n, t, h, d = q.shape
    kv = k.shape[2]
    o = qkernel.prompt_attention((q * scale).reshape(n, t, kv, h // kv, d),
                                 k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3))  # fmt: skip
    return o


# (sequences, positions, KV heads, query heads per KV head, head dim): the first four take the
# blocked path on AVX-512 (positions not a multiple of its 4 as well), the rest the per-position one
SHAPES = [(2, 37, 3, 3, 64), (1, 1, 2, 4, 64), (3, 16, 1, 1, 64), (1, 130, 2, 2, 64),
          (2, 9, 2, 2, 16), (1, 20, 1, 5, 64), (2, 33, 3, 3, 32)]  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_native_prompt_attention_equals_xla(isa, shape):
    n, t, kv, g, d = shape
    rng = np.random.default_rng(sum(shape))
    q = rng.standard_normal((n, t, kv * g, d)).astype(np.float32)
    k = rng.standard_normal((n, t, kv, d)).astype(np.float32)
    v = rng.standard_normal((n, t, kv, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    got = np.asarray(jax.jit(_native, static_argnums=3)(q, k, v, scale))
    want = np.asarray(jax.jit(llama_model._prompt_attention_xla, static_argnums=3)(q, k, v, scale))
    assert got.shape == want.shape == (n, t, kv, g, d)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # causal: a later position's keys and values never reach an earlier one
    k2, v2 = k.copy(), v.copy()
    k2[:, t // 2:] += 5.0
    v2[:, t // 2:] -= 3.0
    again = np.asarray(jax.jit(_native, static_argnums=3)(q, k2, v2, scale))
    np.testing.assert_array_equal(again[:, :t // 2], got[:, :t // 2])


def test_a_mismatched_shape_is_an_error_not_a_crash():
    q = np.zeros((1, 8, 2, 2, 64), np.float32)
    kt = np.zeros((1, 2, 64, 9), np.float32)  # 9 positions against q's 8
    v = np.zeros((1, 2, 8, 64), np.float32)
    with pytest.raises(Exception, match="prompt_attention: shapes do not agree"):
        jax.jit(qkernel.prompt_attention)(q, kt, v).block_until_ready()


def test_the_engine_takes_the_kernel_only_for_its_blocked_path():
    assert qkernel.prompt_attention_fast(16, 2) is False  # per position: XLA's is faster
    assert qkernel.prompt_attention_fast(64, 5) is False
    tiny = build_jax_engine("random:test-tiny:5", 1, 64, prefill_buckets=(16, 64),
                            decode_buckets=(64,))  # fmt: skip
    assert tiny.prompt_attention == "xla"  # head_dim 16
    xla = build_jax_engine("random:tiny-7m:3", 1, 64, prefill_buckets=(16, 64),
                           decode_buckets=(64,), attention="xla")  # fmt: skip
    assert xla.prompt_attention == "xla"


@pytest.mark.skipif(not qkernel.prompt_attention_fast(64, 2),
                    reason="no blocked path here (it needs AVX-512)")  # fmt: skip
def test_an_engine_with_the_kernels_prompt_attention_prefills_as_with_xlas():
    common = dict(prefill_buckets=(16, 32, 64), decode_buckets=(64,), prefill_counts=(1, 2, 4),
                  prefill_batch_tokens=64)  # fmt: skip
    native = build_jax_engine("random:tiny-7m:3", 2, 64, **common)
    xla = build_jax_engine("random:tiny-7m:3", 2, 64, attention="xla", **common)
    assert native.prompt_attention == "native"  # head_dim 64, 2 query heads per KV head
    rng = np.random.default_rng(5)
    prompts = [[int(x) for x in rng.integers(1, 8000, n)] for n in (1, 7, 16, 33, 64)]
    for p in prompts:
        a, b = native.prefill(p, SamplingParams()), xla.prefill(p, SamplingParams())
        assert a.first_token == b.first_token
        np.testing.assert_allclose(a.first_logprob, b.first_logprob, atol=1e-4)
        for ka, kb in zip(a.kv, b.kv, strict=True):
            np.testing.assert_allclose(ka, kb, atol=1e-4 * max(1.0, float(np.abs(kb).max())))
    together = native.prefill_batch(prompts, [SamplingParams()] * len(prompts))
    for p, t in zip(prompts, together, strict=True):
        assert t.first_token == native.prefill(p, SamplingParams()).first_token
