"""What the CPU can multiply fast, read from the kernel's view of it (/proc/cpuinfo on Linux):
the engine picks a weight form from it once, when a worker starts."""

from __future__ import annotations


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's feature flags; empty where the file is missing (not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def has_bf16_matrix_units(flags: frozenset[str]) -> bool:
    """Intel AMX's bfloat16 tiles: XLA's bfloat16 products run on them (jaxlib 0.10's YNNPACK),
    several times float32's speed on a prompt's [tokens, hidden] products (lab/benchmarks.md,
    "Prefill in bfloat16"). Without them, AVX512-BF16's dot products (has_bf16_dot_products)
    still run bfloat16 products at twice float32's arithmetic; without either, XLA widens or
    emulates them."""
    return "amx_bf16" in flags and "amx_tile" in flags


def has_bf16_dot_products(flags: frozenset[str]) -> bool:
    """AVX512-BF16's dot products (AMD Zen 4, Intel Cooper Lake and later): twice float32's
    multiply-adds per instruction, which the kernel's packed bfloat16 products use where there
    are no tiles (lab/benchmarks.md, "Prefill in bfloat16 without tiles")."""
    return "avx512_bf16" in flags
