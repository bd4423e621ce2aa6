"""Weight formats for the decode step's matrices: what is stored, and how it is multiplied.

A matrix is held as `QuantRows` on the host (numpy) and as `QMatrix` on the device (a pytree
of jax arrays with its format as static data). Both keep GGUF's orientation, one row per
output column, blocks of 32 along the input:

    q8_0  qs int8 [N, K], d float16 bits [N, K/32]                 w = d * q
    q4_1  qs uint8 [N, K/2], d, m float16 bits [N, K/32]           w = d * q + m
          (byte j of a block: element j in the low nibble, element j + 16 in the high one)
    bf16  w bfloat16 bits [N, K]
    f32   w float32 [N, K] (the weights as they are, in the kernel's row order)

A GGUF file's own Q8_0, Q4_0 and Q4_1 tensors are split into these arrays without any
rounding (Q4_0's w = d * (q - 8) is q4_1 with m = -8 d, exact in float16), so the engine
computes with exactly the checkpoint's weights. Float32 weights can be quantized to q8_0
(int8 weight-only, ggml's rounding) or rounded to bfloat16.

The product runs in the native kernel (qkernel.py), which widens each weight in registers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from splitserve.engine.kernels import qkernel

BLOCK = 32
FORMATS = qkernel.FORMATS


@dataclass(frozen=True)
class QuantRows:
    """A matrix [N, K] (output rows) in one of FORMATS, as numpy arrays."""

    fmt: str
    arrays: tuple[np.ndarray, ...]  # q8_0: (qs, d); q4_1: (qs, d, m); bf16, f32: (w,)
    shape: tuple[int, int]  # (N, K)

    def take_rows(self, index: np.ndarray) -> QuantRows:
        """Rows reordered or selected (every array is row-indexed)."""
        arrays = tuple(a[index] for a in self.arrays)
        return QuantRows(self.fmt, arrays, (len(index), self.shape[1]))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def concat_rows(parts: list[QuantRows]) -> QuantRows:
    """Stack matrices of one format and input size along the output (fused Q/K/V, gate/up)."""
    fmt, k = parts[0].fmt, parts[0].shape[1]
    if any(p.fmt != fmt or p.shape[1] != k for p in parts):
        raise ValueError("concat_rows needs one format and one input size")
    arrays = tuple(np.concatenate(a, axis=0) for a in zip(*(p.arrays for p in parts), strict=True))
    return QuantRows(fmt, arrays, (sum(p.shape[0] for p in parts), k))


# -- from float32 -----------------------------------------------------------------------------


def quantize_q8_0(w_in_out: np.ndarray) -> QuantRows:
    """Float32 [K, N] (the canonical x @ w orientation) -> q8_0 rows: d = max|w| / 127 per
    block of 32, stored as float16, and q = round(w / d) with that stored d (ggml divides by
    the unrounded one, which adds up to 127 * 2^-11 d of error), so |w - d q| <= d / 2."""
    w = np.ascontiguousarray(np.asarray(w_in_out, np.float32).T)  # [N, K]
    n, k = w.shape
    _check_k(k)
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    d = (np.abs(blocks).max(axis=-1) / 127.0).astype(np.float16)  # [N, K/32]
    d32 = d.astype(np.float32)
    inv = np.divide(1.0, d32, out=np.zeros_like(d32), where=d32 > 0)
    qs = np.clip(np.rint(blocks * inv[..., None]), -127, 127).astype(np.int8).reshape(n, k)
    return QuantRows("q8_0", (qs, d.view(np.uint16)), (n, k))


def to_bf16(w_in_out: np.ndarray) -> QuantRows:
    """Float32 [K, N] -> bfloat16 rows (round to nearest even)."""
    w = np.ascontiguousarray(np.asarray(w_in_out, np.float32).T)
    bits = w.view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    _check_k(w.shape[1])
    return QuantRows("bf16", (rounded.astype(np.uint16),), w.shape)


def to_f32(w_in_out: np.ndarray) -> QuantRows:
    """Float32 [K, N] -> the same weights as rows [N, K], unrounded."""
    w = np.ascontiguousarray(np.asarray(w_in_out, np.float32).T)
    _check_k(w.shape[1])
    return QuantRows("f32", (w,), w.shape)


def from_float(fmt: str, w_in_out: np.ndarray) -> QuantRows:
    if fmt == "q8_0":
        return quantize_q8_0(w_in_out)
    if fmt == "bf16":
        return to_bf16(w_in_out)
    if fmt == "f32":
        return to_f32(w_in_out)
    raise ValueError(f"float32 weights convert to q8_0, bf16 or f32, not {fmt!r}")


# -- from GGUF blocks --------------------------------------------------------------------------

# GGML type name -> bytes per block of 32
_GGUF_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


def gguf_native(type_name: str) -> bool:
    """Whether a GGUF tensor type is kept exactly in one of FORMATS."""
    return type_name in _GGUF_BLOCK_BYTES


def from_gguf_blocks(type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> QuantRows:
    """A GGUF tensor's raw bytes ([N, row bytes]) -> rows, bit for bit. shape: (N, K)."""
    n, k = shape
    _check_k(k)
    size = _GGUF_BLOCK_BYTES[type_name]
    blocks = np.asarray(raw, np.uint8).reshape(n, k // BLOCK, size)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.uint16)[..., 0]  # [N, K/32]
    if type_name == "Q8_0":
        qs = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, k)
        return QuantRows("q8_0", (qs, d), shape)
    if type_name == "Q4_1":
        m = np.ascontiguousarray(blocks[..., 2:4]).view(np.uint16)[..., 0]
        qs = np.ascontiguousarray(blocks[..., 4:]).reshape(n, k // 2)
        return QuantRows("q4_1", (qs, d, m), shape)
    # Q4_0: w = d * (q - 8) = d * q + (-8 d); -8 d is exact in float16 unless it overflows
    m16 = (d.view(np.float16).astype(np.float32) * -8.0).astype(np.float16)
    if not np.isfinite(m16).all():
        raise ValueError("Q4_0 scale too large to keep as q4_1")
    qs = np.ascontiguousarray(blocks[..., 2:]).reshape(n, k // 2)
    return QuantRows("q4_1", (qs, d, m16.view(np.uint16)), shape)


# -- reference ----------------------------------------------------------------------------------


def dequantize(q: QuantRows) -> np.ndarray:
    """The float32 matrix [K, N] (x @ w orientation) that q stands for, exactly."""
    n, k = q.shape
    if q.fmt == "bf16":
        return (q.arrays[0].astype(np.uint32) << 16).view(np.float32).reshape(n, k).T
    if q.fmt == "f32":
        return q.arrays[0].T
    d = q.arrays[1].view(np.float16).astype(np.float32)[..., None]  # [N, K/32, 1]
    if q.fmt == "q8_0":
        w = q.arrays[0].reshape(n, k // BLOCK, BLOCK).astype(np.float32) * d
    else:
        qs = q.arrays[0].reshape(n, k // BLOCK, BLOCK // 2)
        nib = np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.float32)
        w = nib * d + q.arrays[2].view(np.float16).astype(np.float32)[..., None]
    return w.reshape(n, k).T


def _check_k(k: int) -> None:
    if k % BLOCK:
        raise ValueError(f"quantized rows need an input size divisible by {BLOCK}, got {k}")


# -- on device ----------------------------------------------------------------------------------


@jax.tree_util.register_pytree_node_class
class QMatrix:
    """QuantRows on the device: a leaf group of the params pytree; `x @ m` is `matmul(x, m)`."""

    def __init__(self, fmt: str, arrays: tuple, shape: tuple[int, int]):
        self.fmt, self.arrays, self.shape = fmt, tuple(arrays), tuple(shape)

    @classmethod
    def from_rows(cls, rows: QuantRows) -> QMatrix:
        return cls(rows.fmt, tuple(jax.numpy.asarray(a) for a in rows.arrays), rows.shape)

    def tree_flatten(self):
        return self.arrays, (self.fmt, self.shape)

    @classmethod
    def tree_unflatten(cls, aux, arrays):
        return cls(aux[0], arrays, aux[1])


# -- choosing a matrix's form ------------------------------------------------------------------

# Engine weight formats: how the decode (or prefill) step stores its matrices.
#   float32   float32 weights: on the decode side as rows in the native kernel (f32), which
#             reads them faster than XLA's matmul over few rows; on the prefill side (many
#             rows a call) XLA's own matmuls, the reference
#   bfloat16  bf16 rows in the native kernel
#   int8      q8_0 rows quantized from float32 (weight-only int8)
#   gguf      the GGUF file's own Q8_0 / Q4_0 / Q4_1 blocks where it has them, exact;
#             float32 for every other matrix
WEIGHT_FORMATS = ("float32", "bfloat16", "int8", "gguf")
# The prefill side may also take "bfloat16-xla": the weights rounded to bfloat16 and multiplied
# by XLA with the activations rounded too, sums in float32. On a CPU with bfloat16 matrix units
# (AMX) that runs a prompt's products several times as fast as float32 (lab/benchmarks.md,
# "Prefill in bfloat16"); the decode side's few rows a step gain nothing from it.
BF16_XLA = "bfloat16-xla"
# "bfloat16-native": the same numbers (weights and activations rounded to bfloat16, float32
# sums) from the native kernel, with the weights packed once, where XLA packs them on every call:
# on the AMX tiles (lab/benchmarks.md, "Prefill on the tiles") or, on CPUs without tiles, with
# AVX512-BF16's dot products ("Prefill in bfloat16 without tiles"). Where the kernel has neither
# (qkernel.bf16_packed_ready), XLA's products.
BF16_NATIVE = "bfloat16-native"
BF16_FORMS = (BF16_XLA, BF16_NATIVE)
PREFILL_FORMATS = (*WEIGHT_FORMATS, *BF16_FORMS)
# The forms prepare_params (model/params.py) builds: a weight format on one side.
# "float32-rows" is float32 in the kernel's rows, the decode side's float32 where the kernel is
# built.
FLOAT32_ROWS = "float32-rows"
FORMS = (*PREFILL_FORMATS, FLOAT32_ROWS)
_FROM_FLOAT = {"bfloat16": "bf16", "int8": "q8_0", FLOAT32_ROWS: "f32"}


# The largest decode batch that float32 rows serve; larger ones take XLA's matmul.
ROWS_MAX_BATCH = 16


def side_form(weights: str, decode: bool, dtype=np.float32, batch: int = 1,
              rows_max_batch: int = ROWS_MAX_BATCH) -> str:  # fmt: skip
    """The form a side's matrices take for weight format `weights` (at a decode batch size).
    Decode steps of up to rows_max_batch rows are where the kernel streams float32 rows faster
    than XLA's matmul (lab/benchmarks.md, "Weight formats"; at larger batches XLA's was
    faster); prefill multiplies many rows, where XLA's matmul is faster. Weights of another
    dtype stay XLA's."""
    allowed = WEIGHT_FORMATS if decode else PREFILL_FORMATS
    if weights not in allowed:
        raise ValueError(f"weights {weights!r}: one of {allowed}")
    rows = decode and batch <= rows_max_batch and np.dtype(dtype) == np.float32
    if weights == "float32" and rows and qkernel.available():
        return FLOAT32_ROWS
    return weights


def device_matrix(weights: str, parts: Callable[[], list[np.ndarray]], native: list | None,
                  dtype):  # fmt: skip
    """One compute matrix from its canonical float32 parts [K, N_i] (fused along N), in the
    form `weights` names (FORMS): a jax array (XLA matmul), a Bf16Products (XLA's bfloat16
    products) or a QMatrix (native kernel). Falls
    back to the jax array when the kernel is missing, K is not a multiple of 32, or (gguf) some
    part is not one of the file's native blocks. `parts` is a function returning them, called
    only when they are needed (a GGUF file's own blocks need no float32 copy)."""
    if weights not in FORMS:
        raise ValueError(f"weights {weights!r}: one of {FORMS}")

    def fused() -> np.ndarray:
        floats = parts()
        return floats[0] if len(floats) == 1 else np.concatenate(floats, axis=-1)

    if weights == BF16_NATIVE and qkernel.bf16_packed_ready():
        w = fused()
        return PackedBf16(jax.numpy.asarray(pack_bf16(w)), w.shape[1])
    if weights in BF16_FORMS:
        return Bf16Products(jax.numpy.asarray(fused(), jax.numpy.bfloat16))
    own = native and all(q is not None for q in native) and len({q.fmt for q in native}) == 1
    k = native[0].shape[1] if own else parts()[0].shape[0]
    if weights != "float32" and k % BLOCK == 0 and qkernel.available():
        if weights in _FROM_FLOAT:
            return QMatrix.from_rows(from_float(_FROM_FLOAT[weights], fused()))
        if own:
            return QMatrix.from_rows(native[0] if len(native) == 1 else concat_rows(native))
    return jax.numpy.asarray(fused(), dtype)


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class Bf16Products:
    """A matrix [K, N] in bfloat16 that XLA multiplies in bfloat16 (float32 sums): the form
    BF16_XLA names. A wrapper rather than a bare bfloat16 array, which the engine widens to
    float32 before multiplying (param_dtype: CPUs without bfloat16 units multiply float32
    faster)."""

    w: jax.Array

    def tree_flatten(self):
        return (self.w,), None

    @classmethod
    def tree_unflatten(cls, aux, arrays):
        return cls(*arrays)


def bf16_products(x, m: Bf16Products):
    """x [..., K] float32 -> [..., N] float32: x rounded to bfloat16, float32 sums."""
    return jax.numpy.dot(x.astype(jax.numpy.bfloat16), m.w,
                         preferred_element_type=jax.numpy.float32)  # fmt: skip


def pack_bf16(w_in_out: np.ndarray) -> np.ndarray:
    """Float32 [K, N] -> bfloat16 bits (round to nearest even) in the order the kernel's bfloat16
    units read, uint16 [N'/16, K'/32, 16, 32] with K', N' rounded up to multiples of 32 by zero
    weights: per 16 columns and 32 inputs one block (an AMX tile), whose row r holds each
    column's weights of inputs 2r and 2r + 1 side by side (native/bf16_matmul.h)."""
    k, n = w_in_out.shape
    kp, np_ = -(-k // 32) * 32, -(-n // 32) * 32
    padded = np.zeros((kp, np_), np.float32)
    padded[:k, :n] = w_in_out
    bits = to_bf16(padded).arrays[0].T  # [K', N'] bfloat16 bits
    tiles = bits.reshape(kp // 32, 16, 2, np_ // 16, 16)  # [k block, pair r, p, n block, column]
    return np.ascontiguousarray(tiles.transpose(3, 0, 1, 4, 2)).reshape(np_ // 16, kp // 32, 16, 32)


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class PackedBf16:
    """A matrix [K, N] in bfloat16, packed for the kernel's bfloat16 units (pack_bf16): the form
    BF16_NATIVE names where the kernel has one."""

    w: jax.Array  # uint16 [N'/16, K'/32, 16, 32]
    out_dim: int  # N

    def tree_flatten(self):
        return (self.w,), self.out_dim

    @classmethod
    def tree_unflatten(cls, aux, arrays):
        return cls(arrays[0], aux)


def packed_bf16_products(x, m: PackedBf16):
    """x [..., K] float32 -> [..., N] float32 in the kernel's bfloat16 units (AMX tiles or
    AVX512-BF16): x rounded to bfloat16, float32 sums
    (bf16_products' numbers, summed in another order). A K or N that is not a multiple of 32
    is padded with zeros (which add nothing) and the padding's columns are dropped."""
    x16 = x.astype(jax.numpy.bfloat16)
    k_pad = m.w.shape[1] * 32 - x.shape[-1]
    if k_pad:
        x16 = jax.numpy.pad(x16, [(0, 0)] * (x.ndim - 1) + [(0, k_pad)])
    y = qkernel.bf16_packed(x16, m.w, m.w.shape[0] * 16)
    return y if y.shape[-1] == m.out_dim else y[..., :m.out_dim]


def matmul(x, m: QMatrix, rows=None):
    """x [..., K] float32 -> [..., N] float32, inside jit; with rows, only the first rows of x
    are computed (qkernel.qmatmul), the rest are zero."""
    return qkernel.qmatmul(m.fmt, x, m.arrays, m.shape[0], rows)
