"""The worker roles (processes or threads, per config.mode) plus a RouterCore on the caller's
event loop: a pipeline driven in-process, without HTTP. Measurements (lab/serving/detok_path.py) and
the pipeline tests use it; every pipeline has a deadline for readiness and is always stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from router.core import RouterCore
from splitserve import run_dirs
from splitserve.config import ClusterConfig, config_from_dict
from splitserve.launch.health import StackNotReady
from splitserve.launch.processes import ProcessStack
from splitserve.launch.roles import WORKER_ROLES
from splitserve.launch.threads import ThreadStack
from splitserve.tokenizers import load_tokenizer


def fake_engine_config(
    tokenizer: str, mode: str = "processes", **sections: dict[str, Any]
) -> ClusterConfig:
    """A small fake-engine cluster (8 slots, 2 detok workers, fast heartbeats) in a fresh run
    directory (owned by this process: reclaimed by a later start once it is gone); `sections`
    override or add keys, e.g. model={"num_slots": 64}."""
    raw: dict[str, Any] = {
        "model": {"engine": "fake", "tokenizer": tokenizer, "num_slots": 8, "max_seq_len": 512},
        "cluster": {"mode": mode, "detok_workers": 2},
        "lifecycle": {"heartbeat_interval_s": 0.1, "liveness_timeout_s": 1.0},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw, run_dirs.create)


async def wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05
) -> None:
    """Poll `predicate` on the event loop until it holds; TimeoutError, naming `what`, once
    timeout_s have passed."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def pipeline(
    config: ClusterConfig, env: dict[str, str] | None = None, ready_s: float = 600.0
) -> AsyncIterator[tuple[RouterCore, Any]]:
    """(core, stack) once every worker is ready (all detok workers on the ring)."""
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
            # a full pipeline admits requests; every detok worker on the ring is wanted too
            await wait_for(
                lambda: all(w.state == "ready" for w in core.workers.workers.values()),
                ready_s,
                "every worker ready",
            )
        except TimeoutError:
            message = f"pipeline not ready in {ready_s}s; logs in {log_dir}"
            raise StackNotReady(message, []) from None
        yield core, stack
    finally:
        await core.close()
        stack.stop(timeout_s=10)
