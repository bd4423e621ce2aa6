"""[model] weight_format reaches the decode engine: its step's matrices take that form (int8: the
native kernel's q8_0 blocks), while prefill keeps float32 (XLA's products, which its many rows
favour). "auto" on a float32 checkpoint is float32: on the decode side as float32 rows in the
kernel for batches up to quant.ROWS_MAX_BATCH and XLA's matrices above it."""

from __future__ import annotations

import jax
import pytest

from splitserve.config import config_from_dict
from splitserve.engine import build_engine
from splitserve.engine.kernels import qkernel, quant
from splitserve.engine.kernels.quant import QMatrix


def engine_of(role: str, num_slots: int = 2, **model):
    config = config_from_dict({"model": {"path": "random:test-tiny", "num_slots": num_slots,
                                         "max_seq_len": 64, **model},
                               "cluster": {"run_dir": "/x"}})  # fmt: skip
    return build_engine(config.model, 512, role=role)


def kernel_formats(params) -> set[str]:
    leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, QMatrix))
    return {leaf.fmt for leaf in leaves if isinstance(leaf, QMatrix)}


@pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")
def test_the_decode_engine_takes_the_configured_form():
    decode = engine_of("decode", weight_format="int8")
    assert decode.weight_format == "int8" and kernel_formats(decode.decode_params) == {"q8_0"}
    prefill = engine_of("prefill", weight_format="int8")
    assert prefill.weight_format == "float32" and kernel_formats(prefill.params) == set()
    bf16 = engine_of("decode", weight_format="bfloat16")
    assert kernel_formats(bf16.decode_params) == {"bf16"}


def test_auto_is_float32_for_a_float32_checkpoint():
    engine = engine_of("decode")
    assert engine.weight_format == "float32"
    want = {"f32"} if qkernel.available() else set()
    assert kernel_formats(engine.decode_params) == want  # the kernel's float32 rows
    prefill = engine_of("prefill")
    assert prefill.weight_format == "float32" and kernel_formats(prefill.params) == set()  # XLA's


@pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")
def test_float32_decode_batches_above_the_rows_limit_take_xla_matrices():
    engine = engine_of("decode", num_slots=2 * quant.ROWS_MAX_BATCH)
    small = [b for b in engine.shapes.batch_buckets if b <= quant.ROWS_MAX_BATCH]
    large = [b for b in engine.shapes.batch_buckets if b > quant.ROWS_MAX_BATCH]
    assert small and large
    for b in small:
        assert kernel_formats(engine.side_params.decode_at[b]) == {"f32"}
    for b in large:
        assert kernel_formats(engine.side_params.decode_at[b]) == set()
    # one set of XLA matrices, shared with the engine's own prefill
    assert engine.params is engine.side_params.decode_at[large[0]]


@pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")
def test_no_float32_rows_when_their_batch_limit_is_zero():
    """float32_rows_max_batch = 0: XLA's matrices at every batch (what the benchmarks compare)."""
    from splitserve.engine.jax.build import build_jax_engine

    engine = build_jax_engine("random:test-tiny", 2, 64, float32_rows_max_batch=0)
    assert all(kernel_formats(p) == set() for p in engine.side_params.decode_at.values())
    assert engine.params is engine.decode_params  # one set of arrays for both sides
