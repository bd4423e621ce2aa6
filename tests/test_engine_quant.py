"""Weight formats for the native kernel: each product equals float64 numpy on the weights it
stands for (to float32 rounding of the sums), on every instruction set the CPU has, and a request's
result does not depend on what else shares its batch; a GGUF file's own Q8_0/Q4_0/Q4_1 blocks are
kept bit for bit, so an engine computing with them decodes exactly as float32 does on the same
file; int8 and bfloat16 copies of float32 weights stay within their rounding."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.kernels import qkernel, quant
from tests.engine_reference import random_hf_weights
from tests.test_engine_loaders import EPS, HF_NAMES, SHAPE, THETA, llama_cpp_permute

pytestmark = pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")

K, N = 96, 40  # K: three blocks of 32


def _rows(fmt: str, rng) -> quant.QuantRows:
    w = rng.standard_normal((K, N)).astype(np.float32)
    if fmt == "q4_1":
        raw = gguf.quants.quantize(np.ascontiguousarray(w.T), Q.Q4_1)
        return quant.from_gguf_blocks("Q4_1", raw, (N, K))
    return quant.from_float(fmt, w)


_matmul = jax.jit(quant.matmul)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "bf16", "f32"])
def test_kernel_equals_the_reference_product_and_is_batch_invariant(isa, fmt):
    rng = np.random.default_rng(len(fmt))
    rows = _rows(fmt, rng)
    m = quant.QMatrix.from_rows(rows)
    w = quant.dequantize(rows).astype(np.float64)  # [K, N]
    x = rng.standard_normal((17, K)).astype(np.float32)
    alone = np.stack([np.asarray(_matmul(x[r : r + 1], m))[0] for r in range(len(x))])
    for b in (1, 3, 6, 7, 8, 9, 10, 16, 17):
        got = np.asarray(_matmul(x[:b], m))
        want = x[:b].astype(np.float64) @ w
        # float32 sums of K products: well inside 1e-5 of the largest output
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        # every row is bit-identical to its product alone, whatever else is in the batch (the
        # kernel takes batch rows in passes of up to 8, or 6 beside two q4_1 rows, two q8_0
        # rows (from 16 batch rows) or four f32 rows;
        # on AVX2, q8_0, q4_1 and bf16 from 3 batch rows and f32 from 9 in tiles of 3 weight x
        # 4 batch rows)
        np.testing.assert_array_equal(got, alone[:b])
    # leading dims are flattened: [2, 3, K] works like [6, K]
    got3 = np.asarray(_matmul(x[:6].reshape(2, 3, K), m)).reshape(6, N)
    np.testing.assert_array_equal(got3, np.asarray(_matmul(x[:6], m)))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "bf16", "f32"])
def test_kernel_computes_the_live_rows_only_and_the_same_bits(isa, fmt):
    """With a row count (a decode batch's live rows, packed at its front) the kernel computes
    those rows exactly as without it and zeroes the rest; a count outside 1..B means all."""
    rng = np.random.default_rng(7)
    m = quant.QMatrix.from_rows(_rows(fmt, rng))
    x = rng.standard_normal((16, K)).astype(np.float32)
    full = np.asarray(_matmul(x, m))
    for live in (1, 5, 12, 16):
        got = np.asarray(_matmul(x, m, jnp.int32(live)))
        np.testing.assert_array_equal(got[:live], full[:live])
        assert not got[live:].any()
    for outside in (0, -3, 17):
        np.testing.assert_array_equal(np.asarray(_matmul(x, m, jnp.int32(outside))), full)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "f32"])
def test_rows_taken_in_groups_and_the_odd_ones_out_give_the_same_bits(isa, fmt):
    """An odd number of weight rows: the kernel takes q4_1 rows two at a time, q8_0 rows two at
    a time from 16 batch rows and float32 rows four at a time beside several batch rows (one at
    a time up to 4 batch rows), on AVX2 all three at a time beside 4 batch rows (f32 from 9
    batch rows), and the last ones alone; every output equals the product of its batch row
    alone."""
    rng = np.random.default_rng(3)
    n = 41
    w = rng.standard_normal((n, K)).astype(np.float32)
    if fmt == "q4_1":
        rows = quant.from_gguf_blocks("Q4_1", gguf.quants.quantize(w, Q.Q4_1), (n, K))
    elif fmt == "q8_0":
        rows = quant.from_gguf_blocks("Q8_0", gguf.quants.quantize(w, Q.Q8_0), (n, K))
    else:
        rows = quant.from_float("f32", w.T)
    m = quant.QMatrix.from_rows(rows)
    x = rng.standard_normal((23, K)).astype(np.float32)
    alone = np.stack([np.asarray(_matmul(x[r : r + 1], m))[0] for r in range(len(x))])
    for b in (2, 4, 5, 8, 13, 16, 23):
        np.testing.assert_array_equal(np.asarray(_matmul(x[:b], m)), alone[:b])
    want = x.astype(np.float64) @ quant.dequantize(rows)
    assert np.abs(alone - want).max() <= 1e-5 * np.abs(want).max()


def test_kernel_threads_give_the_same_bits():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((512, 2048)).astype(np.float32)  # big enough to be split
    m = quant.QMatrix.from_rows(quant.from_float("q8_0", w))
    x = rng.standard_normal((4, 512)).astype(np.float32)
    qkernel.set_threads(1)
    one = np.asarray(_matmul(x, m))
    qkernel.set_threads(0)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: quant.matmul(a, b) + 0)(x, m)),
                                  one)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_gguf_blocks_are_kept_exactly(qtype):
    rng = np.random.default_rng(int(qtype))
    w = (rng.standard_normal((N, K)) * rng.uniform(0.01, 3, (N, 1))).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype)
    rows = quant.from_gguf_blocks(qtype.name, raw, (N, K))
    want = gguf.quants.dequantize(raw, qtype).reshape(N, K)
    np.testing.assert_array_equal(quant.dequantize(rows).T, want)
    perm = rng.permutation(N)
    np.testing.assert_array_equal(quant.dequantize(rows.take_rows(perm)).T, want[perm])


def test_int8_and_bf16_round_within_their_step():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((K, N)).astype(np.float32)
    rows = quant.quantize_q8_0(w)
    q8 = quant.dequantize(rows)
    step = rows.arrays[1].view(np.float16).astype(np.float32).T  # d per block and column
    assert (np.abs(q8 - w).reshape(K // 32, 32, N) <= step[:, None] * 0.5 * (1 + 1e-6)).all()
    bf = quant.dequantize(quant.to_bf16(w))
    np.testing.assert_array_equal(bf, np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32))


def test_matrices_the_kernel_cannot_take_stay_float32():
    w = np.ones((40, 8), np.float32)  # K = 40: not whole blocks
    assert not isinstance(quant.device_matrix("int8", lambda: [w], None, jnp.float32),
                          quant.QMatrix)  # fmt: skip
    # gguf: only when every fused part is one of the file's own native blocks, and then the
    # float32 parts are never asked for
    part = quant.from_float("q8_0", np.ones((64, 8), np.float32))
    parts = lambda: [np.ones((64, 8), np.float32)] * 2  # noqa: E731

    def never():
        raise AssertionError("float32 parts made for a native matrix")

    assert isinstance(quant.device_matrix("gguf", never, [part, part], jnp.float32), quant.QMatrix)
    assert not isinstance(quant.device_matrix("gguf", parts, [part, None], jnp.float32),
                          quant.QMatrix)  # fmt: skip
    with pytest.raises(ValueError):
        quant.device_matrix("int4", parts, None, jnp.float32)


# -- a whole model --------------------------------------------------------------------------

HIDDEN, INTER, VOCAB = 64, 256, 300
# per layer, the types of (attn_q, attn_k, attn_v), attn_output, (ffn_gate, ffn_up), ffn_down
LAYER_TYPES = [(Q.Q4_1, Q.Q8_0, Q.Q4_0, Q.Q4_1), (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q8_0)]


def _write_quantized_gguf(path: str) -> None:
    """A tied llama GGUF whose every matrix is Q8_0, Q4_0 or Q4_1 (fused groups share a type)."""
    rng = np.random.default_rng(11)
    w = random_hf_weights(rng, VOCAB, HIDDEN, INTER, *SHAPE.values(), True)
    heads, kv_heads = SHAPE["heads"], SHAPE["kv_heads"]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(SHAPE["layers"])
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(THETA)
    writer.add_layer_norm_rms_eps(EPS)

    def add(name, mat, qtype):
        writer.add_tensor(name, gguf.quants.quantize(mat, qtype), raw_dtype=qtype)

    add("token_embd.weight", w["model.embed_tokens.weight"], Q.Q8_0)
    for i, (qkv, out, gate_up, down) in enumerate(LAYER_TYPES):
        p = f"model.layers.{i}."
        writer.add_tensor(f"blk.{i}.attn_norm.weight", w[p + "input_layernorm.weight"])
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        types = {"attn_q": qkv, "attn_k": qkv, "attn_v": qkv, "attn_output": out,
                 "ffn_gate": gate_up, "ffn_up": gate_up, "ffn_down": down}
        for name, hf in HF_NAMES.items():
            mat = w[p + hf + ".weight"]
            if name in ("attn_q", "attn_k"):
                mat = llama_cpp_permute(mat, heads if name == "attn_q" else kv_heads)
            add(f"blk.{i}.{name}.weight", mat, types[name])
    writer.add_tensor("output_norm.weight", w["model.norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("quant") / "q.gguf")
    _write_quantized_gguf(path)
    return path


def _decode(engine, prompt, steps=16):
    p = engine.prefill(prompt, SamplingParams())
    engine.insert(p, 0, SamplingParams())
    out = [p.first_token] + [int(engine.generate().tokens[0]) for _ in range(steps)]
    lps = [p.first_logprob]
    engine.free(0)
    return out, p, lps


def _engine(path, fmt):
    return build_jax_engine(path, 1, 64, prefill_buckets=(16, 64), decode_buckets=(64,),
                            weight_format=fmt, prefill_weight_format=fmt)


def test_the_files_own_blocks_decode_exactly_as_float32(gguf_path):
    own = _engine(gguf_path, "gguf")
    ref = _engine(gguf_path, "float32")
    layers = own.decode_params["layers"]
    assert all(isinstance(layer[name], quant.QMatrix) for layer in layers
               for name in ("wqkv", "wo", "w_gate_up", "w_down"))
    assert isinstance(own.decode_params["head"][0], quant.QMatrix)
    for seed in range(3):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, 9 + seed)]
        got, got_p, _ = _decode(own, prompt)
        want, want_p, _ = _decode(ref, prompt)
        assert got == want
        np.testing.assert_allclose(got_p.first_logprob, want_p.first_logprob, atol=1e-4)
        for a, b in zip(got_p.kv, want_p.kv, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-4)


# (format, log-probability tolerance, KV tolerance relative to its largest value). Measured over 20
# prompts on this model: int8 moved the greedy token's log-probability by up to 0.072 and the KV by
# 1.7%, bfloat16 by 0.021 and 0.8%; the tolerances are twice that.
REQUANTIZED = [("int8", 0.15, 0.035), ("bfloat16", 0.05, 0.016)]


@pytest.mark.parametrize("fmt,lp_tol,kv_tol", REQUANTIZED, ids=[r[0] for r in REQUANTIZED])
def test_requantized_weights_stay_close_to_float32(gguf_path, fmt, lp_tol, kv_tol):
    """int8 and bfloat16 round the float32 weights, so results move by their rounding."""
    got = _engine(gguf_path, fmt)
    ref = _engine(gguf_path, "float32")
    for seed in range(4):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, 12)]
        a = got.prefill(prompt, SamplingParams())
        b = ref.prefill(prompt, SamplingParams())
        assert abs(a.first_logprob - b.first_logprob) < lp_tol
        for x, y in zip(a.kv, b.kv, strict=True):
            assert np.abs(x - y).max() < kv_tol * max(1.0, np.abs(y).max())
