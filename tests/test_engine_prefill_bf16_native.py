"""The prompt pass's products in the kernel's bfloat16 units ([model] prefill_weight_format =
"bfloat16-native"): the weights packed once in the order both units read, the products of each
unit this process has (AMX tiles, AVX512-BF16 dot products) equal to the exact sums of the
bfloat16-rounded inputs within float32's rounding, each row the same whatever the batch and the
threads, and an engine whose prompt pass gives bfloat16-xla's results (the same numbers, summed
in another order). Where the kernel has neither unit the form is XLA's bfloat16 products, and
the tests of the units themselves are skipped with the reason."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitserve.engine.interface import SamplingParams
from splitserve.engine.kernels import qkernel, quant
from tests.test_engine_prefill_bf16 import _engine, _prompt, check_batch_equals_alone


def _units_here() -> list[str]:
    """The units this process can run the packed products on (a tile host has both)."""
    if not qkernel.available():
        return []
    try:
        return [u for u in ("amx", "avx512-bf16") if qkernel.set_bf16_unit(u) == u]
    finally:
        qkernel.set_bf16_unit(None)


UNITS = _units_here()
any_unit = pytest.mark.skipif(not UNITS, reason="neither AMX-BF16 tiles nor AVX512-BF16 here "
                                                "(CPU, build or Linux)")  # fmt: skip


@pytest.fixture(params=UNITS or [None])
def unit(request):
    """Each unit in turn; the best one again afterwards."""
    if request.param is None:
        pytest.skip("neither AMX-BF16 tiles nor AVX512-BF16 here (CPU, build or Linux)")
    assert qkernel.set_bf16_unit(request.param) == request.param
    yield request.param
    qkernel.set_bf16_unit(None)


def _bf16(a: np.ndarray) -> np.ndarray:
    """a rounded to bfloat16 (to nearest even), as float64."""
    return np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64)


def _products(x, w):
    """x @ w through the packed products, on the unit set now (the kernel reads it at each
    call, so a compiled program of an earlier test runs on it too)."""
    m = quant.PackedBf16(jnp.asarray(quant.pack_bf16(w)), w.shape[1])
    return np.asarray(jax.jit(quant.packed_bf16_products)(x, m))


def test_packing_puts_each_weight_where_the_units_read_it():
    rng = np.random.default_rng(0)
    k, n = 70, 40  # neither a multiple of 32: padded with zeros
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = quant.pack_bf16(w)
    assert packed.shape == (64 // 16, 96 // 32, 16, 32) and packed.dtype == np.uint16
    want = (np.asarray(jnp.asarray(w, jnp.bfloat16)).view(np.uint16))
    for kk, nn in [(0, 0), (1, 0), (2, 5), (33, 17), (69, 39), (31, 16)]:
        tile = packed[nn // 16, kk // 32]
        assert tile[(kk % 32) // 2, (nn % 16) * 2 + kk % 2] == want[kk, nn], (kk, nn)
    # the padding is zero weights: columns 40..63, inputs 70..95
    assert not packed[3].any() and not packed[2, :, :, 16:].any()
    assert not packed[:, 2, 3:, :].any()


@pytest.mark.parametrize("lead, k, n", [((1,), 32, 32), ((17,), 576, 960), ((31,), 64, 96),
                                        ((32,), 64, 64), ((33,), 1536, 576), ((300,), 96, 3072),
                                        ((2, 45), 70, 40), ((3, 1), 172, 344),
                                        ((13,), 64, 224), ((121,), 32, 96)])  # fmt: skip
def test_each_unit_sums_the_rounded_inputs_exactly_up_to_float32(unit, lead, k, n):
    rng = np.random.default_rng(k * n)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    got = _products(x, w)
    assert got.shape == (*lead, n) and got.dtype == np.float32
    exact = _bf16(x) @ _bf16(w)
    # float32 sums of k products: each within k * 2^-24 of the sum of their magnitudes
    bound = k * 2.0**-24 * (np.abs(_bf16(x)) @ np.abs(_bf16(w))) + 1e-30
    assert (np.abs(got - exact) <= bound).all(), float((np.abs(got - exact) / bound).max())
    theirs = quant.Bf16Products(jnp.asarray(w, jnp.bfloat16))
    xla = np.asarray(jax.jit(quant.bf16_products)(x, theirs))
    assert (np.abs(got - xla) <= 2 * bound).all()  # XLA's bfloat16 products: the same numbers


def test_a_row_is_the_same_alone_in_a_batch_and_on_any_thread_count(unit):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((150, 576)).astype(np.float32)  # past one panel of rows
    w = rng.standard_normal((576, 960)).astype(np.float32)
    m = quant.PackedBf16(jnp.asarray(quant.pack_bf16(w)), 960)
    f = jax.jit(quant.packed_bf16_products)
    full = np.asarray(f(x, m))
    for lo, hi in [(0, 1), (33, 40), (64, 100), (95, 100), (119, 133), (149, 150)]:
        np.testing.assert_array_equal(np.asarray(f(x[lo:hi], m)), full[lo:hi])
    qkernel.set_threads(1)
    try:
        np.testing.assert_array_equal(np.asarray(f(x, m)), full)
    finally:
        qkernel.set_threads(0)


@any_unit
def test_a_process_without_a_unit_gets_a_clear_error():
    x, w = np.ones((4, 64), np.float32), np.ones((64, 32), np.float32)
    assert qkernel.set_bf16_unit("none") == "none"
    try:
        with pytest.raises(Exception, match="neither AMX tiles nor AVX512-BF16"):
            _products(x, w)
    finally:
        qkernel.set_bf16_unit(None)
    assert qkernel.bf16_packed_unit() == UNITS[0]


@any_unit
def test_a_wrong_packed_matrix_is_an_error_not_a_crash():
    x = jnp.ones((4, 64), jnp.bfloat16)
    packed = jnp.zeros((2, 2, 16, 32), jnp.uint16)  # a [64, 32] matrix
    with pytest.raises(Exception, match="bf16_packed: K and N multiples of 32"):
        jax.jit(lambda a, b: qkernel.bf16_packed(a, b, 64))(x, packed).block_until_ready()
    with pytest.raises(Exception, match="bf16_packed: K and N multiples of 32"):
        wide = jnp.ones((4, 96), jnp.bfloat16)  # K 96 against a matrix packed for 64
        jax.jit(lambda a, b: qkernel.bf16_packed(a, b, 32))(wide, packed).block_until_ready()


@pytest.fixture(scope="module")
def native():
    return _engine(quant.BF16_NATIVE)


@pytest.fixture(scope="module")
def xla():
    return _engine(quant.BF16_XLA)


def test_the_layers_take_the_packed_form_where_the_kernel_has_a_unit(native):
    want = quant.PackedBf16 if qkernel.bf16_packed_ready() else quant.Bf16Products
    for layer in native.params["layers"]:
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            assert isinstance(layer[name], want), (name, type(layer[name]))
    assert all(h.dtype == jnp.float32 for h in native.params["head"])  # one row a prompt
    leaves = jax.tree_util.tree_leaves(native.decode_params, is_leaf=lambda x: isinstance(
        x, (quant.PackedBf16, quant.Bf16Products)))  # fmt: skip
    assert not any(isinstance(x, (quant.PackedBf16, quant.Bf16Products)) for x in leaves)


def test_the_prompt_pass_gives_bfloat16_xlas_results(native, xla):
    for i, n in enumerate([1, 3, 9, 16, 30, 41, 64]):
        prompt = _prompt(200 + i, n)
        got, want = native.prefill(prompt, SamplingParams()), xla.prefill(prompt, SamplingParams())
        assert got.length == want.length == n
        assert got.first_token == want.first_token, f"prompt {i}"
        np.testing.assert_allclose(got.first_logprob, want.first_logprob, atol=1e-4)
        for a, b in zip(got.kv, want.kv, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-4 * max(1.0, float(np.abs(b).max())))


def test_batched_prompts_in_the_kernel_equal_one_at_a_time(native):
    check_batch_equals_alone(native, 1e-5)
