"""The decode layer's tail in one native call (native/layer_tail.c) against the same layer as
separate operations (llama_model: the output product, residual add, norm, SwiGLU, residual add):
the same values to float32 rounding, every row independent of the others, the rows after the
live ones left as they came, and the engine's greedy tokens unchanged."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.engine import JaxEngine
from splitserve.engine.kernels import qkernel, quant
from splitserve.engine.model import llama_model
from splitserve.engine.model.llama_config import LlamaConfig
from tests.engine_reference import random_hf_weights
from tests.test_engine_model import canonical_from_hf

pytestmark = pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")

H, A, INTER, EPS = 96, 64, 160, 1e-5  # multiples of 32: the kernel's blocks
FORMATS = ["q8_0", "q4_1", "bf16", "f32"]


def _matrix(fmt: str, rng, k: int, n: int) -> quant.QMatrix:
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    if fmt == "q4_1":
        raw = gguf.quants.quantize(np.ascontiguousarray(w.T), Q.Q4_1)
        return quant.QMatrix.from_rows(quant.from_gguf_blocks("Q4_1", raw, (n, k)))
    return quant.QMatrix.from_rows(quant.from_float(fmt, w))


def _layer(fmt: str, seed: int) -> tuple[LlamaConfig, dict]:
    rng = np.random.default_rng(seed)
    cfg = LlamaConfig(vocab_size=64, hidden=H, intermediate=INTER, layers=1, heads=4, kv_heads=2,
                      head_dim=A // 4, rms_eps=EPS)  # fmt: skip
    lw = {
        "wo": _matrix(fmt, rng, A, H),
        "w_gate_up": _matrix(fmt, rng, H, 2 * INTER),
        "w_down": _matrix(fmt, rng, INTER, H),
        "ffn_norm": jnp.asarray((1.0 + 0.2 * rng.standard_normal(H)).astype(np.float32)),
    }
    return cfg, lw


def _separate(cfg, lw, x, attn, live):
    """The tail as separate operations, as the engine runs it beyond the fused batch sizes."""
    x = x + llama_model._matmul(attn, lw["wo"], live)
    return x + llama_model._mlp(cfg, lw, llama_model.rms_norm(x, lw["ffn_norm"], cfg.rms_eps), live)


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_call_equals_the_separate_operations(isa, fmt):
    cfg, lw = _layer(fmt, len(fmt))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, H)).astype(np.float32)
    attn = rng.standard_normal((4, A)).astype(np.float32)
    fused = jax.jit(lambda x, a, live: llama_model._layer_tail(cfg, lw, x, a, live))
    separate = jax.jit(lambda x, a, live: _separate(cfg, lw, x, a, live))
    for b in (1, 3, 4):
        got = np.asarray(fused(x[:b], attn[:b], None))
        want = np.asarray(separate(x[:b], attn[:b], None))
        # the norm's sum and silu's exp round differently; nothing else does
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
        # each row as it comes alone, bit for bit, whatever runs beside it
        alone = np.concatenate([np.asarray(fused(x[r : r + 1], attn[r : r + 1], None))
                                for r in range(b)])  # fmt: skip
        np.testing.assert_array_equal(got, alone)


@pytest.mark.parametrize("fmt", ["q4_1", "f32"])
def test_rows_after_the_live_ones_come_back_as_they_were(fmt):
    cfg, lw = _layer(fmt, 11)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, H)).astype(np.float32)
    attn = rng.standard_normal((4, A)).astype(np.float32)
    fused = jax.jit(lambda x, a, live: llama_model._layer_tail(cfg, lw, x, a, live))
    full = np.asarray(fused(x, attn, None))
    for live in (1, 2, 3):
        got = np.asarray(fused(x, attn, jnp.int32(live)))
        np.testing.assert_array_equal(got[:live], full[:live])
        np.testing.assert_array_equal(got[live:], x[live:])
        want = np.asarray(jax.jit(lambda x, a, n: _separate(cfg, lw, x, a, n))(x, attn, live))
        np.testing.assert_array_equal(got[live:], want[live:])  # x + 0 + 0 there too
    for outside in (0, -1, 9):  # as the products take it: all rows
        np.testing.assert_array_equal(np.asarray(fused(x, attn, jnp.int32(outside))), full)


def test_silu_against_float64():
    """SwiGLU's exp is a polynomial in the AVX-512 path. Weights that make gate_i = c_i * n_0,
    up_i = n_1 and y_i = x_i + act_i show silu over gates from -30 to 30 against float64."""
    cfg, lw = _layer("f32", 3)
    c = np.linspace(-30.0, 30.0, INTER).astype(np.float32)
    gate_up = np.zeros((H, 2 * INTER), np.float32)  # [in, out]
    gate_up[0, :INTER] = c
    gate_up[1, INTER:] = 1.0
    down = np.zeros((INTER, H), np.float32)
    down[np.arange(H), np.arange(H)] = 1.0
    lw["w_gate_up"] = quant.QMatrix.from_rows(quant.from_float("f32", gate_up))
    lw["w_down"] = quant.QMatrix.from_rows(quant.from_float("f32", down))
    lw["wo"] = quant.QMatrix.from_rows(quant.from_float("f32", np.zeros((A, H), np.float32)))
    lw["ffn_norm"] = jnp.ones(H, jnp.float32)
    x = np.zeros((1, H), np.float32)
    x[0, :2] = (1.0, 1.0)  # n_0 = n_1 = sqrt(H / 2)
    tail = jax.jit(lambda x: llama_model._layer_tail(cfg, lw, x, jnp.zeros((1, A)), None))
    act = np.asarray(tail(x))[0] - x[0]
    n = np.sqrt(H / 2 / (1 + EPS * H / 2))
    g = c.astype(np.float64)[:H] * n
    want = g / (1.0 + np.exp(-g)) * n
    np.testing.assert_allclose(act, want, rtol=2e-6, atol=1e-6)


def _engine_tokens(fmt: str, fused: bool, monkeypatch) -> list[list[int]]:
    rng = np.random.default_rng(9)
    vocab, layers, heads, kv_heads, head_dim = 128, 2, 4, 2, 16
    w = random_hf_weights(rng, vocab, H, INTER, layers, heads, kv_heads, head_dim, False)
    cfg = LlamaConfig(vocab_size=vocab, hidden=H, intermediate=INTER, layers=layers, heads=heads,
                      kv_heads=kv_heads, head_dim=head_dim, rms_eps=EPS)  # fmt: skip
    traced = []  # which form the decode programs were traced with
    tail = llama_model._layer_tail  # only decode calls it: traced again in each engine
    monkeypatch.setattr(llama_model, "_layer_tail", lambda *a: traced.append("tail") or tail(*a))
    if fused:
        one_call = qkernel.layer_tail
        monkeypatch.setattr(qkernel, "layer_tail",
                            lambda *a: traced.append("one call") or one_call(*a))  # fmt: skip
    else:
        monkeypatch.setattr(llama_model, "FUSED_TAIL_MAX_BATCH", 0)
        mlp = llama_model._mlp
        monkeypatch.setattr(llama_model, "_mlp", lambda *a: traced.append("separate") or mlp(*a))
    # XLA's attention: with the native one each whole layer is one call (decode_layer.c), which
    # test_engine_decode_layer.py checks against this path
    engine = JaxEngine(cfg, canonical_from_hf(w, layers, False), 4, 64, weight_format=fmt,
                       attention="xla")  # fmt: skip
    greedy = SamplingParams()
    out = []
    for slot, prompt in enumerate(([3, 17, 29, 5], [8, 1, 44], [60, 2, 9, 11, 13])):
        prefix = engine.prefill(prompt, greedy)
        engine.insert(prefix, slot, greedy)
        out.append([prefix.first_token])
    for _ in range(12):
        step = engine.generate()
        for slot in range(3):
            out[slot].append(int(step.tokens[slot]))
    assert set(traced) == {"tail", "one call" if fused else "separate"}
    return out


@pytest.mark.parametrize("fmt", ["float32", "int8"])
def test_the_engine_decodes_the_same_tokens(fmt, monkeypatch):
    assert _engine_tokens(fmt, True, monkeypatch) == _engine_tokens(fmt, False, monkeypatch)
