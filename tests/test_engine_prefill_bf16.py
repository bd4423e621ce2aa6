"""The prefill side in XLA's bfloat16 products ([model] prefill_weight_format = "bfloat16-xla"):
every matrix of the prompt pass is held in bfloat16 and multiplied in it (float32 sums), the
decode side keeps its own form, and the prompt's first log-probabilities and KV stay within the
stated tolerance of float32's; a batch of prompts gives what each gives alone."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.kernels.cpu_features import cpu_flags, has_bf16_matrix_units
from splitserve.engine.kernels.quant import BF16_XLA, Bf16Products

MAX_SEQ = 64
# bfloat16 keeps 8 bits of a value: each product's inputs are within 2^-9 of float32's, and the
# test model's 2 layers compound that into a KV within 3% of its largest value (measured on an
# AMX host: at most 0.87% over these prompts) and a first log-probability within 0.05
# (measured: 0.026)
KV_TOLERANCE = 0.03
LOGPROB_TOLERANCE = 0.05


def _engine(fmt: str):
    return build_jax_engine("random:test-tiny:5", 2, MAX_SEQ, prefill_buckets=(16, 32, 64),
                            decode_buckets=(MAX_SEQ,), prefill_counts=(1, 2, 4),
                            prefill_batch_tokens=64, prefill_weight_format=fmt)  # fmt: skip


@pytest.fixture(scope="module")
def bf16():
    return _engine(BF16_XLA)


@pytest.fixture(scope="module")
def f32():
    return _engine("float32")


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 512, n)]


def _bf16_matrices(params) -> list[Bf16Products]:
    leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, Bf16Products))
    return [leaf for leaf in leaves if isinstance(leaf, Bf16Products)]


def test_every_layer_matrix_is_bfloat16_the_head_float32_and_decode_keeps_its_own(bf16):
    layers = bf16.params["layers"]
    for layer in layers:
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            assert isinstance(layer[name], Bf16Products)
            assert layer[name].w.dtype == jax.numpy.bfloat16
    # one row per prompt: XLA would widen a bfloat16 head to float32 every call (llama_model)
    assert all(h.dtype == jax.numpy.float32 for h in bf16.params["head"])
    assert bf16.params["embed"].dtype == jax.numpy.float32  # looked up, not multiplied
    assert len(_bf16_matrices(bf16.params)) == 4 * bf16.cfg.layers
    assert _bf16_matrices(bf16.decode_params) == []


def _dot_operand_types(hlo: str) -> list[tuple[str, str, str]]:
    """(result, lhs, rhs) element types of every dot in an optimized HLO module, looked up
    among the names each computation defines (a fused dot's operands are its parameters)."""
    found = []
    for body in re.split(r"\n(?=\S)", hlo):  # one chunk per computation
        types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", body))
        for out, lhs, rhs in re.findall(r"= (\w+)\[[^\n]*? dot\(%([\w.\-]+), %([\w.\-]+)\)", body):
            found.append((out, types.get(lhs, "?"), types.get(rhs, "?")))
    return found


def _lowered_dot_types(engine, key) -> list[tuple[str, str, str]]:
    """(lhs, rhs, result) element types of every dot_general the program asks XLA for."""
    fn, args = engine.specs.lowered(key)
    text = fn.lower(*args).as_text()
    tensor = r"tensor<(?:\d+x)*(\w+)>"  # the dimensions, then the element type
    return re.findall(rf"stablehlo\.dot_general.*?: \({tensor}, {tensor}\) -> {tensor}", text)


def test_the_prompt_pass_asks_for_bfloat16_products(bf16, f32):
    key = ("prefill", 1, 16)
    dots = _lowered_dot_types(bf16, key)
    # each layer's four products with a weight matrix: bfloat16 in, float32 out (the head's
    # product stays float32)
    assert dots.count(("bf16", "bf16", "f32")) == 4 * bf16.cfg.layers, dots
    assert all(d in (("bf16", "bf16", "f32"), ("f32", "f32", "f32")) for d in dots), dots
    # the float32 engine's are all float32 (the parse sees them)
    dots32 = _lowered_dot_types(f32, key)
    assert len(dots32) == len(dots) and set(dots32) == {("f32", "f32", "f32")}


@pytest.mark.skipif(not has_bf16_matrix_units(cpu_flags()), reason="no bfloat16 matrix units")
def test_on_bfloat16_matrix_units_the_compiled_products_stay_bfloat16(bf16):
    """Where the CPU has AMX-BF16, XLA keeps the layers' products in bfloat16 (elsewhere it may
    widen them to float32 and run them as float32: the answers are the same, the speed not)."""
    dots = _dot_operand_types(bf16.programs.obtain(("prefill", 1, 16))[0].as_text())
    in_bf16 = [d for d in dots if d[1:] == ("bf16", "bf16")]
    assert len(in_bf16) >= 4 * bf16.cfg.layers, dots
    assert all(out == "f32" for out, _, _ in in_bf16)


def test_bfloat16_prefill_is_within_tolerance_of_float32(bf16, f32):
    kv_err, lp_err, same = 0.0, 0.0, 0
    lengths = [3, 9, 16, 30, 41, 64]
    for i, n in enumerate(lengths):
        prompt = _prompt(100 + i, n)
        got, want = bf16.prefill(prompt, SamplingParams()), f32.prefill(prompt, SamplingParams())
        assert got.length == want.length == n
        same += got.first_token == want.first_token
        lp_err = max(lp_err, abs(got.first_logprob - want.first_logprob))
        for a, b in zip(got.kv, want.kv, strict=True):
            assert a.shape == b.shape
            kv_err = max(kv_err, float(np.abs(a - b).max() / np.abs(b).max()))
    assert kv_err <= KV_TOLERANCE and lp_err <= LOGPROB_TOLERANCE, (kv_err, lp_err)
    assert kv_err > 0  # the products really ran in bfloat16
    assert same >= len(lengths) - 1  # a near tie may flip a first token; more would not be noise


def check_batch_equals_alone(engine, atol: float) -> None:
    """A batch of prompts (greedy and seeded) gives each prompt's first token, log-probability
    and KV as it gives alone, within atol (relative to the largest KV value)."""
    lengths = [5, 16, 1, 9, 30, 12, 3, 64, 7]
    prompts = [_prompt(i, n) for i, n in enumerate(lengths)]
    samplings = [SamplingParams(temperature=0.8, top_k=20, seed=i) if i % 3 else SamplingParams()
                 for i in range(len(prompts))]  # fmt: skip
    together = engine.prefill_batch(prompts, samplings)
    alone = [engine.prefill(p, s) for p, s in zip(prompts, samplings, strict=True)]
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert b.first_token == a.first_token, f"prompt {i}"
        np.testing.assert_allclose(b.first_logprob, a.first_logprob, atol=atol)
        for ka, kb in zip(a.kv, b.kv, strict=True):
            np.testing.assert_allclose(kb, ka, atol=atol * max(1.0, float(np.abs(ka).max())))


def test_batched_bfloat16_prefill_equals_one_at_a_time(bf16):
    check_batch_equals_alone(bf16, 1e-4)


def test_the_decode_side_is_float32s_whatever_the_prefill(bf16, f32):
    """A bfloat16 prompt pass feeds the same decode step as float32's: the one prefix decodes to
    the same tokens and log-probabilities in either engine."""
    prefix = bf16.prefill(_prompt(7, 20), SamplingParams())

    def decode(engine):
        engine.insert(prefix, 0, SamplingParams())
        try:
            steps = [engine.generate() for _ in range(6)]
        finally:
            engine.free(0)
        return [int(s.tokens[0]) for s in steps], [float(s.logprobs[0]) for s in steps]

    (got, got_lp), (want, want_lp) = decode(bf16), decode(f32)
    assert got == want
    np.testing.assert_allclose(got_lp, want_lp, atol=1e-5)
