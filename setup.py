"""Build glue for the one native piece: the engine's kernels (splitserve/engine/native: quantized
matmuls and decode attention),
compiled with the C compiler into splitserve/engine/_qmatmul*.so and loaded by
splitserve/engine/qkernel.py through ctypes and jax.ffi. Everything else is in setup.cfg.

The kernel is plain C11 against XLA's vendored FFI C header, so a C compiler is all it needs
(no jaxlib, no Python headers). `optional=True`: where it cannot be compiled the install still
succeeds and the engine runs float32 weights through XLA.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "splitserve.engine._qmatmul",
            sources=[
                "splitserve/engine/native/ffi_common.c",
                "splitserve/engine/native/qmatmul.c",
                "splitserve/engine/native/attention.c",
            ],
            include_dirs=["splitserve/engine/native"],
            depends=[
                "splitserve/engine/native/ffi_common.h",
                "splitserve/engine/native/xla/ffi_c_api.h",
            ],
            extra_compile_args=["-O3", "-std=gnu11", "-fvisibility=hidden"],
            libraries=["m"],
            optional=True,
        )
    ]
)
