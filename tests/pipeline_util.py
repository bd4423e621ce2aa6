"""Helpers for tests that run a real pipeline: worker processes (or threads) and a router core.

Every pipeline started here has a deadline and is stopped in a finally block, also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from typing import Any

from router.core import RouterCore
from splitserve.config import ClusterConfig, config_from_dict
from splitserve.launcher import WORKER_ROLES, ProcessStack, ThreadStack
from splitserve.tokenizers import load_tokenizer


def make_config(
    tokenizer: str, mode: str = "processes", **sections: dict[str, Any]
) -> ClusterConfig:
    raw: dict[str, Any] = {
        "model": {"engine": "fake", "tokenizer": tokenizer, "num_slots": 8, "max_seq_len": 512},
        "cluster": {"mode": mode, "detok_workers": 2},
        "lifecycle": {"heartbeat_interval_s": 0.1, "liveness_timeout_s": 1.0},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    raw["cluster"].setdefault("run_dir", tempfile.mkdtemp(prefix="ss-"))
    return config_from_dict(raw)


def run(coro, timeout_s: float = 120.0):
    """Run an async test body with a hard deadline."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


@contextlib.asynccontextmanager
async def pipeline(config: ClusterConfig, env: dict[str, str] | None = None, ready_s: float = 90.0):
    """Worker roles (processes or threads, per config.mode) plus a RouterCore on this loop."""
    log_dir = f"{config.run_dir}/logs"
    if config.mode == "processes":
        stack: Any = ProcessStack(config, roles=WORKER_ROLES, env=env, log_dir=log_dir)
        ctx = None
    else:
        stack = ThreadStack(config, environ=env)
        ctx = stack.ctx
    tok = load_tokenizer(config.model.tokenizer)
    core = RouterCore(config, tok.vocab_size, tok.eos_ids, ctx=ctx)
    try:
        stack.start()
        await core.start()
        try:
            await core.wait_ready(ready_s)
        except TimeoutError:
            raise AssertionError(f"pipeline not ready in {ready_s}s; logs in {log_dir}") from None
        # a full pipeline admits requests; tests also want every detok worker on the ring
        await wait_for(
            lambda: all(w.state == "ready" for w in core.workers.workers.values()),
            ready_s,
            f"every worker ready; logs in {log_dir}",
        )
        yield core, stack
    finally:
        await core.close()
        stack.stop(timeout_s=10)


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


async def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval_s)
