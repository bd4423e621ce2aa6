"""The JAX engine's weights on the device, each side's in the form its programs run fastest in.

Matrices take the form a weight format names (kernels/quant.py: WEIGHT_FORMATS): float32 (on
the decode side as rows in the native kernel, on the prefill side for XLA: quant.side_form), or
a quantized form for the native kernel; prefill may use another. "auto" keeps a GGUF file's own
Q8_0/Q4_0/Q4_1 blocks (exact) and float32 for any other checkpoint (int8 and bfloat16 round its
weights: opt-in). Prefill defaults to float32, because it multiplies many rows at once, where
XLA's float32 products beat the kernel; it may take XLA's bfloat16 products instead
(quant.BF16_XLA: weights and activations rounded, float32 sums), which CPUs with bfloat16 matrix
units run several times as fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitserve.engine.kernels import quant
from splitserve.engine.kernels.huge_pages import collapse as collapse_onto_huge_pages
from splitserve.engine.model.llama_config import LlamaConfig
from splitserve.engine.model.params import prepare_params


@dataclass(frozen=True)
class SideParams:
    """The parameter pytrees an engine's programs take, and the formats they were made in."""

    prefill: dict  # the prefill side's
    decode_at: dict[int, dict]  # the decode side's, by batch bucket (the same pytree per form)
    weight_format: str  # the decode side's
    prefill_weight_format: str


def side_params(
    cfg: LlamaConfig,
    weights: dict[str, np.ndarray],
    *,
    sides: Sequence[str],
    batch_buckets: Sequence[int],
    weight_format: str,
    prefill_weight_format: str | None,
    native: dict | None,
    param_dtype,
    float32_rows_max_batch: int,
    huge_pages: bool,
) -> SideParams:
    """Each side's matrices in its form (quant.side_form): a float32 decode side holds the
    kernel's rows, and XLA's matrices too only when it has batch buckets above
    float32_rows_max_batch (0: XLA's at every batch). One set of arrays per distinct form.

    A worker runs one side: the other side's weights would cost memory and start-up time for
    nothing, so an engine of one side runs the other (when asked to) in its own weights."""
    if weight_format == "auto":  # a GGUF file's own blocks when it has them (exact)
        weight_format = "gguf" if native else "float32"
    prefill_weight_format = prefill_weight_format or "float32"
    if not set(sides) <= {"prefill", "decode"} or not sides:
        raise ValueError(f"sides {sides!r}: some of 'prefill', 'decode'")
    form_of = {b: quant.side_form(weight_format, True, param_dtype, b, float32_rows_max_batch)
               for b in batch_buckets}  # fmt: skip
    prefill_form = quant.side_form(prefill_weight_format, False, param_dtype)
    if "decode" not in sides:
        weight_format = prefill_weight_format
        form_of = dict.fromkeys(batch_buckets, prefill_form)
    elif "prefill" not in sides:  # the largest bucket's: XLA's where there are both
        prefill_weight_format = weight_format
        prefill_form = form_of[batch_buckets[-1]]
    built = {
        form: prepare_params(cfg, weights, param_dtype, weights=form, native=native)
        for form in dict.fromkeys([*form_of.values(), prefill_form])
    }
    # every step streams the weights: fewer page translations (kernels/huge_pages.py)
    if huge_pages:
        collapse_onto_huge_pages(built.values())
    return SideParams(
        prefill=built[prefill_form],
        decode_at={b: built[f] for b, f in form_of.items()},
        weight_format=weight_format,
        prefill_weight_format=prefill_weight_format,
    )
