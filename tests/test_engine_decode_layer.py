"""A whole decode layer in one native call (native/decode_layer.c) against the same step as
separate calls (llama_model.decode with the layer as its parts: XLA's norm, rotation and cache
writes, the QKV product, native attention and the layer's tail): the same logits and caches to
float32 rounding, every row independent of the others, the rows after the live ones and their
cache rows left alone, the caches updated in place, bad lengths refused, and the engine's
tokens unchanged."""

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
from splitserve.engine.model.params import prepare_params
from tests.engine_reference import random_hf_weights
from tests.test_engine_model import canonical_from_hf

pytestmark = pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")

VOCAB, H, INTER, LAYERS, HEADS, KV, D, EPS = 128, 96, 160, 2, 4, 2, 16, 1e-5
ROWS, CAPACITY = 16, 40  # ROWS: llama_model.FUSED_LAYER_MAX_BATCH
CFG = LlamaConfig(vocab_size=VOCAB, hidden=H, intermediate=INTER, layers=LAYERS, heads=HEADS,
                  kv_heads=KV, head_dim=D, rms_eps=EPS)  # fmt: skip
FORMATS = ["q8_0", "q4_1", "bf16", "f32"]
FORM = {"q8_0": "int8", "bf16": "bfloat16", "f32": quant.FLOAT32_ROWS, "q4_1": "int8"}


def _canonical(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    w = random_hf_weights(rng, VOCAB, H, INTER, LAYERS, HEADS, KV, D, False)
    return canonical_from_hf(w, LAYERS, False)


def _q4_1(w_in_out: np.ndarray) -> quant.QMatrix:
    k, n = w_in_out.shape
    raw = gguf.quants.quantize(np.ascontiguousarray(w_in_out.T), Q.Q4_1)
    return quant.QMatrix.from_rows(quant.from_gguf_blocks("Q4_1", raw, (n, k)))


def _params(fmt: str, seed: int = 1) -> dict:
    w = _canonical(seed)
    params = prepare_params(CFG, w, weights=FORM[fmt])
    if fmt == "q4_1":  # a GGUF file's blocks: made here from the same floats
        for i, lw in enumerate(params["layers"]):
            lw["wqkv"] = _q4_1(np.concatenate([w["wq"][i], w["wk"][i], w["wv"][i]], axis=1))
            lw["wo"] = _q4_1(w["wo"][i])
            lw["w_gate_up"] = _q4_1(np.concatenate([w["w_gate"][i], w["w_up"][i]], axis=1))
            lw["w_down"] = _q4_1(w["w_down"][i])
    assert llama_model._fused_layer_format(params, ROWS) == fmt
    return params


def _caches(seed: int) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    ck = [rng.standard_normal((ROWS, KV, D, CAPACITY)).astype(np.float32) for _ in range(LAYERS)]
    cv = [rng.standard_normal((ROWS, KV, CAPACITY, D)).astype(np.float32) for _ in range(LAYERS)]
    return ck, cv


TOKENS = np.random.default_rng(0).integers(0, VOCAB, ROWS).astype(np.int32)
POSITIONS = np.array([0, 17, 39, 8, *range(2, 38, 3)], np.int32)  # the first and last included


def _step(params, fused: bool):
    """The decode step, jitted: each layer in one call, or (fused=False) as its parts."""
    layer_format = llama_model._fused_layer_format

    def step(ck, cv, tokens, positions, live):
        if not fused:  # traced here, with the whole-layer call switched off for this trace
            llama_model._fused_layer_format = lambda *a: None
        try:
            return llama_model.decode(CFG, params, ck, cv, tokens, positions, "native", live)
        finally:
            llama_model._fused_layer_format = layer_format

    return jax.jit(step)


def _numpy(out):
    logits, ck, cv = out
    return np.asarray(logits), [np.asarray(c) for c in ck], [np.asarray(c) for c in cv]


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_call_equals_the_separate_calls(isa, fmt):
    params = _params(fmt)
    ck, cv = _caches(2)
    fused, separate = _step(params, True), _step(params, False)
    for b in (1, 3, 9, 16):
        args = (ck, cv, TOKENS[:b], POSITIONS[:b], None)
        got, want = _numpy(fused(*args)), _numpy(separate(*args))
        # the norm's sums, the rotation's roundings and silu's exp differ; nothing else does
        np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-5 * np.abs(want[0]).max())
        for g, w_, old in zip(got[1] + got[2], want[1] + want[2], ck + cv, strict=True):
            np.testing.assert_allclose(g, w_, rtol=0, atol=1e-5 * np.abs(w_).max())
            # nothing but the new positions of the rows in the step is written
            written = np.zeros(old.shape, bool)
            for r in range(b):
                if old.shape[-1] == CAPACITY:  # keys: [rows, KV, D, C]
                    written[r, :, :, POSITIONS[r]] = True
                else:  # values: [rows, KV, C, D]
                    written[r, :, POSITIONS[r], :] = True
            np.testing.assert_array_equal(g[~written], old[~written])
        # each row as it comes alone, bit for bit, whatever runs beside it
        for r in range(b):
            one = _numpy(fused([c[r:r + 1] for c in ck], [c[r:r + 1] for c in cv],
                               TOKENS[r:r + 1], POSITIONS[r:r + 1], None))  # fmt: skip
            np.testing.assert_array_equal(one[0][0], got[0][r])
            for c_one, c_all in zip(one[1] + one[2], got[1] + got[2], strict=True):
                np.testing.assert_array_equal(c_one[0], c_all[r])


@pytest.mark.parametrize("fmt", ["q4_1", "f32"])
def test_rows_after_the_live_ones_are_left_alone(fmt):
    params = _params(fmt, 3)
    ck, cv = _caches(4)
    fused = _step(params, True)
    full = _numpy(fused(ck, cv, TOKENS, POSITIONS, None))
    for live in (1, 2, 7, 15):
        logits, got_k, got_v = _numpy(fused(ck, cv, TOKENS, POSITIONS, jnp.int32(live)))
        np.testing.assert_array_equal(logits[:live], full[0][:live])
        for got, whole, old in zip(got_k + got_v, full[1] + full[2], ck + cv, strict=True):
            np.testing.assert_array_equal(got[:live], whole[:live])
            np.testing.assert_array_equal(got[live:], old[live:])  # not written
    for outside in (0, -1, 17):  # as the products take it: all rows
        out = _numpy(fused(ck, cv, TOKENS, POSITIONS, jnp.int32(outside)))
        np.testing.assert_array_equal(out[0], full[0])


def test_the_caches_are_updated_in_place_when_donated_and_copied_when_not():
    params = _params("f32", 5)
    ck, cv = _caches(6)

    def step(ck, cv, tokens, positions):
        return llama_model.decode(CFG, params, ck, cv, tokens, positions, "native")

    args = ([jnp.asarray(c) for c in ck], [jnp.asarray(c) for c in cv], TOKENS, POSITIONS)
    hlo = jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile().as_text()
    cache_shapes = {f"f32[{','.join(map(str, c.shape))}]" for c in (ck[0], cv[0])}
    copies = [line for line in hlo.splitlines()
              if " copy(" in line and any(s in line for s in cache_shapes)]  # fmt: skip
    assert copies == []
    # and the results are the donated buffers themselves
    donated = [jnp.asarray(c) for c in ck], [jnp.asarray(c) for c in cv]
    pointers = [a.unsafe_buffer_pointer() for a in donated[0] + donated[1]]
    _, out_k, out_v = jax.jit(step, donate_argnums=(0, 1))(*donated, TOKENS, POSITIONS)
    assert [a.unsafe_buffer_pointer() for a in out_k + out_v] == pointers
    # not donated: the arguments keep their values, the results have the new positions
    before = [np.asarray(c).copy() for c in args[0] + args[1]]
    _, new_k, new_v = jax.jit(step)(*args)
    for arr, old in zip(args[0] + args[1], before, strict=True):
        np.testing.assert_array_equal(np.asarray(arr), old)
    assert not np.array_equal(np.asarray(new_k[0]), before[0])
    assert not np.array_equal(np.asarray(new_v[0]), before[LAYERS])


def test_lengths_outside_the_capacity_are_refused():
    params = _params("q8_0", 7)
    ck, cv = _caches(8)
    fused = _step(params, True)
    bad = POSITIONS.copy()
    bad[1] = CAPACITY  # one past the last position
    with pytest.raises(jax.errors.JaxRuntimeError, match="lengths must be in 1..C"):
        _numpy(fused(ck, cv, TOKENS, bad, None))
    # a padding row's position is not looked at
    _numpy(fused(ck, cv, TOKENS, bad, jnp.int32(1)))


def _engine_tokens(fmt: str, fused: bool, monkeypatch) -> list[list[int]]:
    """Greedy and seeded tokens of three requests in one engine, each layer one call or not."""
    traced = []  # which form the decode programs were traced with
    one_call = qkernel.decode_layer
    monkeypatch.setattr(qkernel, "decode_layer",
                        lambda *a, **k: traced.append("one call") or one_call(*a, **k))  # fmt: skip
    if not fused:
        monkeypatch.setattr(llama_model, "_fused_layer_format",
                            lambda *a: traced.append("parts") or None)  # fmt: skip
    engine = JaxEngine(CFG, _canonical(9), 4, 64, weight_format=fmt)
    samplings = (SamplingParams(), SamplingParams(temperature=0.8, seed=11), SamplingParams())
    out = []
    for slot, prompt in enumerate(([3, 17, 29, 5], [8, 1, 44], [60, 2, 9, 11, 13])):
        prefix = engine.prefill(prompt, samplings[slot])
        engine.insert(prefix, slot, samplings[slot])
        out.append([prefix.first_token])
    for _ in range(12):
        step = engine.generate()
        for slot in range(3):
            out[slot].append(int(step.tokens[slot]))
    assert set(traced) == ({"one call"} if fused else {"parts"})
    return out


@pytest.mark.parametrize("fmt", ["float32", "int8"])
def test_the_engine_decodes_the_same_tokens(fmt, monkeypatch):
    assert _engine_tokens(fmt, True, monkeypatch) == _engine_tokens(fmt, False, monkeypatch)
