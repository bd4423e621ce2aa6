"""[model] weight_format reaches the decode engine: its step's matrices take that form (int8: the
native kernel's q8_0 blocks), while prefill keeps float32 (XLA's products, which its many rows
favour). "auto" on a float32 checkpoint is float32."""

from __future__ import annotations

import jax
import pytest

from splitserve.config import config_from_dict
from splitserve.engine import build_engine, qkernel
from splitserve.engine.quant import QMatrix


def engine_of(role: str, **model):
    config = config_from_dict({"model": {"path": "random:test-tiny", "num_slots": 2,
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
    assert engine.weight_format == "float32" and kernel_formats(engine.decode_params) == set()
