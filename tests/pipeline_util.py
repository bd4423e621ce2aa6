"""Helpers for tests that run a real pipeline: worker processes (or threads) and a router core.

The pipeline itself, its fake-engine config and its waits are the launcher's
(splitserve.launch.pipeline): every pipeline has a deadline and is always stopped, also on failure.
"""

from __future__ import annotations

import asyncio
from typing import Any

from router.core import RouterCore
from splitserve.launch.pipeline import fake_engine_config as make_config
from splitserve.launch.pipeline import pipeline, wait_for

__all__ = ["expected_fake_tokens", "make_config", "pipeline", "programs_compiled", "run",
           "wait_for", "worker_loads"]


def run(coro, timeout_s: float = 120.0):
    """Run an async test body with a hard deadline."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def expected_fake_tokens(
    prompt: list[int], vocab: int, max_tokens: int, eos_ids=frozenset(), ignore_eos=False
) -> tuple[list[int], str]:
    """What the fake engine must produce, worked out by hand from its documented arithmetic:
    prefill weight 2, generate weight 4 plus the output position."""
    tokens = [(2 * sum(prompt)) % vocab]
    while True:
        if tokens[-1] in eos_ids and not ignore_eos:
            return tokens, "stop"
        if len(tokens) >= max_tokens:
            return tokens, "length"
        tokens.append((4 * tokens[-1] + len(tokens)) % vocab)


async def worker_loads(core: RouterCore, role: str) -> list[dict[str, Any]]:
    return [w.load for w in core.workers.workers.values() if w.role == role]


async def programs_compiled(core: RouterCore, timeout_s: float = 600.0) -> None:
    """Until every worker's load says nothing compiles after Ready any more (the decode
    workers' multi-step programs, the prefill workers' prefix-cache continuations): a test of
    what those programs do waits for them (until then their stand-ins run)."""

    def done() -> bool:
        loads = [w.load for w in core.workers.workers.values() if w.role in ("prefill", "decode")]
        return all(ld is not None and getattr(ld, "compiling", 0) == 0
                   and getattr(ld, "prefix_compiling", 0) == 0 for ld in loads)  # fmt: skip

    await wait_for(done, timeout_s, "the programs compiled after Ready", interval_s=0.2)
