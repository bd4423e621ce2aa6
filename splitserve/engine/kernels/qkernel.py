"""The native weight-only quantized matmul (native/qmatmul.c) behind jax.ffi.

The package's build compiles it into `splitserve/engine/_qmatmul*.so` (setup.py; a plain C
shared library, loaded with ctypes, not a Python module). When the build could not compile it,
`available()` is False and the engine runs float32 weights through XLA instead.

FFI targets: one matmul per storage format (see quant.py for the layouts), and decode
attention (native/attention.c):
    splitserve_q8_0(x, qs, d) -> y        splitserve_q4_1(x, qs, d, m) -> y
    splitserve_bf16(x, w) -> y            splitserve_f32(x, w) -> y
                                          x: [..., K] float32; y: [..., N] float32
    splitserve_<fmt>_rows(x, ..., rows)   the same for the leading rows[0] rows of x only
                                          (int32 [1]; the rest of y is zero)
    splitserve_<fmt>_layer_tail(x, attn, norm, eps, rows, wo.., w_gate_up.., w_down..) -> y
                                          a decode layer after its attention, in one call
                                          (native/layer_tail.c)
    splitserve_<fmt>_decode_layer(x, cache_k, cache_v, lengths, cos, sin, attn_norm, ffn_norm,
                                  eps, rows, wqkv.., wo.., w_gate_up.., w_down..)
                                  -> y, cache_k, cache_v (in place), work
                                          a whole decode layer in one call
                                          (native/decode_layer.c)
    splitserve_attention(q, cache_k, cache_v, lengths) -> out
    splitserve_prompt_attention(q, kt, v) -> out      a prompt pass's causal attention
and a prompt pass's bfloat16 products on AMX tiles or AVX512-BF16 (native/bf16_matmul.c),
where `bf16_packed_unit()` names one:
    splitserve_bf16_packed(x, w) -> y     x: [..., K] bfloat16, w packed (quant.pack_bf16);
                                          y: [..., N] float32
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

import jax
import jax.numpy as jnp

FORMATS = ("q8_0", "q4_1", "bf16", "f32")
TARGETS = (*FORMATS, *(f"{f}_rows" for f in FORMATS), *(f"{f}_layer_tail" for f in FORMATS),
           *(f"{f}_decode_layer" for f in FORMATS), "attention", "prompt_attention", "bf16_packed")
ISA_NAMES = {0: "portable", 1: "avx2", 2: "avx512"}
# the units of the packed bfloat16 products (native/bf16_matmul.c)
BF16_UNITS = {0: "none", 1: "avx512-bf16", 2: "amx"}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_error: str | None = None


def library_path() -> str | None:
    """The built library, or None. setup.py builds it in the engine package (one folder up),
    beside its sources in engine/native/."""
    engine = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = sorted(glob.glob(os.path.join(engine, "_qmatmul*.so")))
    return found[0] if found else None


def _load() -> ctypes.CDLL | None:
    global _lib, _error
    with _lock:
        if _lib is not None or _error is not None:
            return _lib
        path = os.environ.get("SPLITSERVE_QKERNEL") or library_path()
        if path is None:
            _error = "native kernel not built (pip install -e . compiles it)"
            return None
        try:
            lib = ctypes.CDLL(path)
            for name in TARGETS:
                capsule = jax.ffi.pycapsule(getattr(lib, f"splitserve_{name}"))
                jax.ffi.register_ffi_target(f"splitserve_{name}", capsule, platform="cpu")
        except (OSError, AttributeError) as exc:
            _error = f"native kernel at {path} unusable: {exc}"
            return None
        lib.splitserve_qkernel_set_isa.restype = ctypes.c_int
        lib.splitserve_qkernel_isa.restype = ctypes.c_int
        lib.splitserve_bf16_unit.restype = ctypes.c_int
        lib.splitserve_bf16_set_unit.restype = ctypes.c_int
        lib.splitserve_prompt_attention_fast.restype = ctypes.c_int
        lib.splitserve_prompt_attention_fast.argtypes = [ctypes.c_int64, ctypes.c_int64]
        lib.splitserve_qkernel_share_cores.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.splitserve_qkernel_shared_calls.restype = ctypes.c_longlong
        _lib = lib
        return lib


def available() -> bool:
    return _load() is not None


def unavailable_reason() -> str | None:
    _load()
    return _error


def isa() -> str:
    """The instruction set the kernel uses on this CPU."""
    lib = _load()
    return "none" if lib is None else ISA_NAMES[lib.splitserve_qkernel_isa()]


def bf16_packed_unit() -> str:
    """What runs the packed bfloat16 products here: "amx" (the CPU has AMX-BF16, the build knew
    the instructions, and Linux lets this process use the tiles), "avx512-bf16" (the CPU's
    bfloat16 dot products, without tiles) or "none"."""
    lib = _load()
    return "none" if lib is None else BF16_UNITS[lib.splitserve_bf16_unit()]


def bf16_packed_ready() -> bool:
    """Whether the kernel runs the packed bfloat16 products here (on either unit)."""
    return bf16_packed_unit() != "none"


def set_bf16_unit(name: str | None) -> str:
    """Use a lesser unit for the packed bfloat16 products (tests run both units a tile host
    has), None the best; returns the one in use."""
    lib = _require()
    want = -1 if name is None else {v: k for k, v in BF16_UNITS.items()}[name]
    return BF16_UNITS[lib.splitserve_bf16_set_unit(want)]


def set_isa(name: str) -> str:
    """Use a lesser instruction set (tests run every path the CPU has); returns the one in use."""
    lib = _require()
    want = {v: k for k, v in ISA_NAMES.items()}[name]
    return ISA_NAMES[lib.splitserve_qkernel_set_isa(want)]


def set_threads(n: int) -> None:
    """At most n threads per product (0: all of XLA's intra-op pool; 1: the caller alone)."""
    _require().splitserve_qkernel_set_threads(n)


# the marks share_cores() follows, kept alive here: the library reads them on every call
_shared_marks: ctypes.Array | None = None


def share_cores(marks: memoryview | None, threads: int) -> None:
    """While any byte of `marks` is nonzero, each call takes at most `threads` threads (at
    least 1); None stops following marks. `marks` is a writable buffer that other processes
    change (an mmap of splitserve/core_share.py's file): the library reads it at each call,
    and it must outlive the engine."""
    global _shared_marks
    lib = _require()
    if marks is None:
        lib.splitserve_qkernel_share_cores(None, 0, 1)
        _shared_marks = None
        return
    view = (ctypes.c_ubyte * len(marks)).from_buffer(marks)
    lib.splitserve_qkernel_share_cores(ctypes.addressof(view), len(marks), max(1, threads))
    _shared_marks = view


def shared_calls() -> int:
    """Kernel calls so far that found a mark set (and so took fewer threads)."""
    return int(_require().splitserve_qkernel_shared_calls())


def _require() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise RuntimeError(_error)
    return lib


def qmatmul(fmt: str, x, arrays, out_dim: int, rows=None):
    """x [..., K] float32 @ the quantized matrix held in `arrays` -> [..., out_dim] float32.
    rows (a traced int32 scalar, or None: all): compute only the first `rows` rows of x (the
    leading dimensions flattened), the rest of the result is zero; each computed row is the
    same as without it. Traced inside jit: one custom call."""
    _require()
    out = jax.ShapeDtypeStruct((*x.shape[:-1], out_dim), jnp.float32)
    if rows is None:
        return jax.ffi.ffi_call(f"splitserve_{fmt}", out)(x.astype(jnp.float32), *arrays)
    rows = jnp.reshape(jnp.asarray(rows, jnp.int32), (1,))
    return jax.ffi.ffi_call(f"splitserve_{fmt}_rows", out)(x.astype(jnp.float32), *arrays, rows)


def layer_tail(fmt: str, x, attn, norm, eps: float, rows, wo, w_gate_up, w_down):
    """A decode layer after its attention, for the leading `rows` rows (a traced int32; None:
    all): x1 = x + attn @ wo, then x1 + SwiGLU(rms_norm(x1) * norm) through w_gate_up and
    w_down; the other rows come back as x. x [B, H], attn [B, A] float32; each w the arrays
    of a matrix in format fmt (quant.QMatrix.arrays). Traced inside jit: one custom call."""
    _require()
    b, h = x.shape
    inter = w_gate_up[0].shape[0] // 2
    # the second result is the kernel's room for the rows between the products
    out = (jax.ShapeDtypeStruct((b, h), jnp.float32),
           jax.ShapeDtypeStruct((b, 2 * h + 3 * inter), jnp.float32))  # fmt: skip
    rows = jnp.reshape(jnp.asarray(0 if rows is None else rows, jnp.int32), (1,))
    eps = jnp.full((1,), eps, jnp.float32)
    y, _work = jax.ffi.ffi_call(f"splitserve_{fmt}_layer_tail", out)(
        x.astype(jnp.float32), attn.astype(jnp.float32), norm.astype(jnp.float32), eps, rows,
        *wo, *w_gate_up, *w_down,
    )
    return y


def decode_layer(fmt: str, x, cache_k, cache_v, lengths, cos, sin, attn_norm, ffn_norm,
                 eps: float, rows, wqkv, wo, w_gate_up, w_down):
    """A whole decode layer for the leading `rows` rows (a traced int32; None: all): x [B, H]
    normed by attn_norm, the QKV product, q and k rotated by cos, sin [B, D/2] (q scaled by
    1/sqrt(D)), k and v written into cache_k [R, KV, D, C] and cache_v [R, KV, C, D] at
    position lengths - 1 (lengths int32 [B]), attention over positions 0..lengths - 1, then
    the layer's tail (layer_tail). Each w the arrays of a matrix in format fmt. Returns
    (y [B, H], cache_k, cache_v): the caches are updated in place (aliased; donate them to
    the jitted step or XLA copies them first), their rows after the live ones untouched, and
    y's rows there are x's. Traced inside jit: one custom call."""
    _require()
    b, h = x.shape
    kv, d, c = cache_k.shape[1], cache_k.shape[2], cache_k.shape[3]
    qkv_n = wqkv[0].shape[0]
    heads = qkv_n // d - 2 * kv
    inter = w_gate_up[0].shape[0] // 2
    # the kernel's room for the rows between its phases (native/decode_layer.c, work_floats)
    work = h + qkv_n + 2 * heads * d + 2 * h + 3 * inter + heads * (c + 24)
    out = (jax.ShapeDtypeStruct((b, h), jnp.float32),
           jax.ShapeDtypeStruct(cache_k.shape, jnp.float32),
           jax.ShapeDtypeStruct(cache_v.shape, jnp.float32),
           jax.ShapeDtypeStruct((b, work), jnp.float32))  # fmt: skip
    rows = jnp.reshape(jnp.asarray(0 if rows is None else rows, jnp.int32), (1,))
    eps = jnp.full((1,), eps, jnp.float32)
    call = jax.ffi.ffi_call(f"splitserve_{fmt}_decode_layer", out,
                            input_output_aliases={1: 1, 2: 2})  # fmt: skip
    y, cache_k, cache_v, _work = call(
        x.astype(jnp.float32), cache_k, cache_v, lengths.astype(jnp.int32),
        cos.astype(jnp.float32), sin.astype(jnp.float32), attn_norm.astype(jnp.float32),
        ffn_norm.astype(jnp.float32), eps, rows, *wqkv, *wo, *w_gate_up, *w_down,
    )
    return y, cache_k, cache_v


def bf16_packed(x, packed, out_dim: int):
    """x [..., K] bfloat16 @ weights packed for the bfloat16 units (quant.pack_bf16; K and
    out_dim the packed sizes, multiples of 32) -> [..., out_dim] float32, float32 sums. Inside
    jit."""
    _require()
    out = jax.ShapeDtypeStruct((*x.shape[:-1], out_dim), jnp.float32)
    return jax.ffi.ffi_call("splitserve_bf16_packed", out)(x, packed)


def attention(q, cache_k, cache_v, lengths):
    """Decode attention of rows [0, n): q [n, KV, G, D] float32 (scaled), cache_k
    [rows, KV, D, C], cache_v [rows, KV, C, D], lengths [n] int32 (positions attended, from 0)
    -> [n, KV, G, D] float32. Traced inside jit: one custom call."""
    _require()
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call("splitserve_attention", out)(q, cache_k, cache_v, lengths)


def prompt_attention_fast(head_dim: int, group: int) -> bool:
    """Whether prompt_attention runs its blocked path for these heads (AVX-512, head_dim 64, at
    most 4 query heads per KV head), faster than XLA's batched products there; elsewhere it
    goes position by position, which is slower than XLA's."""
    lib = _load()
    return lib is not None and bool(lib.splitserve_prompt_attention_fast(head_dim, group))


def prompt_attention(q, kt, v):
    """A prompt pass's causal attention: q [N, T, KV, G, D] float32 (scaled), kt [N, KV, D, T]
    (keys transposed), v [N, KV, T, D] -> [N, T, KV, G, D] float32, position t attending to
    positions 0..t of its own sequence. Traced inside jit: one custom call."""
    _require()
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call("splitserve_prompt_attention", out)(q, kt, v)
