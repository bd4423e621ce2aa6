"""Build glue for the one native piece: the engine's kernels (splitserve/engine/native: quantized
matmuls, decode attention and the prompt pass's bfloat16 products),
compiled with the C compiler into splitserve/engine/_qmatmul*.so and loaded by
splitserve/engine/kernels/qkernel.py through ctypes and jax.ffi. Everything else is in setup.cfg.

The kernel is plain C11 against XLA's FFI C header, which jaxlib ships (jax.ffi.include_dir()):
so it is built where jax is installed, which build isolation hides. The Makefile installs the
dependencies first and then builds this with --no-build-isolation; an install without jax
builds nothing. `optional=True`: where it cannot be compiled the install still succeeds and the
engine runs float32 weights through XLA.
"""

from setuptools import Extension, setup


def xla_ffi_include() -> list[str] | None:
    """jaxlib's include directory (xla/ffi/api/c_api.h), or None where jax is not importable."""
    try:
        from jax import ffi
    except ImportError:
        return None
    return [ffi.include_dir()]


INCLUDE = xla_ffi_include()

setup(
    ext_modules=[] if INCLUDE is None else [
        Extension(
            "splitserve.engine._qmatmul",
            sources=[
                "splitserve/engine/native/ffi_common.c",
                "splitserve/engine/native/qmatmul.c",
                "splitserve/engine/native/qmatmul_x86.c",
                "splitserve/engine/native/attention.c",
                "splitserve/engine/native/bf16_matmul.c",
                "splitserve/engine/native/bf16_amx.c",
                "splitserve/engine/native/bf16_dot.c",
                "splitserve/engine/native/layer_tail.c",
                "splitserve/engine/native/decode_layer.c",
            ],
            include_dirs=["splitserve/engine/native", *INCLUDE],
            depends=[
                "splitserve/engine/native/ffi_common.h",
                "splitserve/engine/native/qmatmul.h",
                "splitserve/engine/native/attention.h",
                "splitserve/engine/native/layer_tail.h",
                "splitserve/engine/native/bf16_matmul.h",
            ],
            extra_compile_args=["-O3", "-std=gnu11", "-fvisibility=hidden"],
            libraries=["m"],
            optional=True,
        )
    ]
)
