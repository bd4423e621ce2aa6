"""XLA:CPU compile options per kind of program, chosen by measurement (lab/benchmarks.md,
"Prefill's products in YNNPACK").

jaxlib 0.10's default hands dots, reductions and element-wise fusions to YNNPACK. A prefill
program's products are [tokens, hidden] x [hidden, N] matrices, which YNNPACK runs faster than
Eigen; the decode side's programs keep YNNPACK for reductions only: a step's [slots, hidden]
products in XLA (a weight format the native kernel does not take) ran slower in YNNPACK than
in Eigen. Options are given per compile
rather than in XLA_FLAGS, so that one process holding both sides (threads mode) compiles each
program with its own. An option the operator sets in XLA_FLAGS is left to XLA_FLAGS.
Experimental options change between jaxlib releases and an unknown one fails the compile, so
each applies only to the release line it was measured on.
"""

from __future__ import annotations

import os

# the kinds of program (a program key's first item) that run prompts; the rest are decode-side
PROMPT_KINDS = frozenset({"prefill", "prefill_cont", "prompt"})

_DECODE_SIDE = {
    "0.10.": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"},
}


def compile_options(kind: str) -> dict[str, str]:
    """The compiler_options for a program of this kind on the running jaxlib."""
    if kind in PROMPT_KINDS:
        return {}
    from jaxlib import version

    operator_flags = os.environ.get("XLA_FLAGS", "")
    for prefix, options in _DECODE_SIDE.items():
        if version.__version__.startswith(prefix):
            return {k: v for k, v in options.items() if f"--{k}" not in operator_flags}
    return {}
