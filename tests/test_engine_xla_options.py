"""XLA compile options per kind of program (engine/compile/xla_options.py): prompt programs keep
jaxlib's YNNPACK products, decode-side programs keep YNNPACK for reductions only, an option the
operator sets in XLA_FLAGS is left to XLA_FLAGS, and the engine compiles each program with its
kind's options."""

from __future__ import annotations

import re

import pytest
from jaxlib import version

from splitserve.engine.compile import program_table, xla_options
from splitserve.engine.jax.build import build_jax_engine

YNN = "xla_cpu_experimental_ynn_fusion_type"
measured = pytest.mark.skipif(
    not version.__version__.startswith("0.10."), reason="options measured on jaxlib 0.10 only"
)


@measured
def test_prompt_kinds_take_defaults_and_decode_kinds_reductions_only(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    for kind in ("prefill", "prefill_cont", "prompt"):
        assert xla_options.compile_options(kind) == {}
    for kind in ("decode", "sample", "controls", "insert", "move", "resize", "gather"):
        assert xla_options.compile_options(kind) == {YNN: "LIBRARY_FUSION_TYPE_REDUCE"}


@measured
def test_an_operator_flag_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"--xla_cpu_enable_fast_math=false --{YNN}=dot")
    assert xla_options.compile_options("decode") == {}


def _ynn_products(hlo: str) -> int:
    """How many of an executable's dots run inside a YNNPACK fusion: the fused computations
    that YNNPACK fusions call, counted by the dots in their bodies."""
    called = set(re.findall(r"%ynn_fusion[.\d]* = .*?calls=%([\w.\-]+)", hlo))
    bodies = re.split(r"\n(?=\S)", hlo)  # one chunk per computation
    count = 0
    for body in bodies:
        name = re.match(r"(?:ENTRY )?%([\w.\-]+)", body)
        if name and name.group(1) in called:
            count += len(re.findall(r" dot\(", body))
    return count


@measured
def test_the_engine_compiles_each_program_with_its_kinds_options(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    eng = build_jax_engine("random:test-tiny:5", 2, 64, prefill_buckets=(16, 64),
                           decode_buckets=(64,), prefill_counts=(1,))  # fmt: skip
    assert _ynn_products(eng.programs.obtain(("prefill", 1, 16))[0].as_text()) > 0
    # every prompt kind names a program the engine compiles: a renamed kind would otherwise
    # fall silently to the decode side's options
    for key in [("prefill", 1, 16), ("prefill_cont", 16, 16), ("prompt", 16)]:
        assert key[0] in xla_options.PROMPT_KINDS
        eng.specs.lowered(key)
    # the same program given the decode side's options: its products leave YNNPACK, so the
    # engine's compile is what takes the options (and they do what they say)
    decode_side = xla_options.compile_options("decode")
    monkeypatch.setattr(program_table, "compile_options", lambda kind: decode_side)
    assert _ynn_products(eng.programs.obtain(("prefill", 1, 16))[0].as_text()) == 0
