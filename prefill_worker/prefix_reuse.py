"""The prefill worker's use of its prefix cache (prefix_cache.py): before a prefill, the
prompt's longest cached block run becomes the engine's cached KV; after it, the prompt's blocks
not yet cached are cut from the Prefix and stored.

Reuse never changes a result: the engine computes the same Prefix either way (its contract,
Engine.prefill_cached), and a request whose answer reads every prompt position (prompt logprobs)
is computed from scratch. A block's arrays are copies, never views of a Prefix whose buffers go
out on the wire. Nothing but the cache holds a block between two prefills, so an abort, a failed
prefill or a restart leaves nothing referenced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prefill_worker.prefix_cache import PrefixCache
from splitserve.config import ModelConfig
from splitserve.engine.interface import Engine, Prefix
from splitserve.prefix_blocks import block_keys, reusable_blocks
from splitserve.protocol import GenerateRequest

CHECK_LIMIT = 20_000  # blocks up to which each load report verifies the cache's invariants


@dataclass
class Hit:
    tokens: int = 0  # prompt tokens cached
    kv: list[np.ndarray] | None = None  # the engine's KV of them (Engine.prefill_cached)
    blocks: list[list[np.ndarray]] = field(default_factory=list)  # the cached blocks' arrays


def token_axis(engine: Engine) -> int:
    """The axis along which the engine's KV arrays run over the prompt (from kv_layout)."""
    one, two = engine.kv_layout(1)[0][1], engine.kv_layout(2)[0][1]
    return next(i for i, (a, b) in enumerate(zip(one, two, strict=True)) if a != b)


class PrefixReuse:
    def __init__(self, engine: Engine, model: ModelConfig):
        on = model.prefix_cache and engine.supports_prefix_reuse and model.prefix_cache_mb > 0
        self.cache = (PrefixCache(model.prefix_block_tokens, int(model.prefix_cache_mb * 2**20))
                      if on else None)  # fmt: skip
        self.axis = token_axis(engine) if on else 0
        # (cache.changes, result) of the last check: a load report (8 a second) re-checks only a
        # cache that changed since (the check walks every block in Python)
        self._checked: tuple[int, int] | None = None

    def lookup(self, req: GenerateRequest) -> Hit:
        """The request's cached prefix (none when the cache is off or the request needs every
        prompt position computed)."""
        if self.cache is None or needs_every_position(req):
            return Hit()
        cached, blocks = self.cache.lookup(req.prompt)
        if not cached:
            return Hit()
        kv = [np.concatenate(parts, axis=self.axis) for parts in zip(*blocks, strict=True)]
        return Hit(cached, kv, blocks)

    def first_block(self, req: GenerateRequest) -> bytes | None:
        """The key of the request's first reusable block (None when the cache is off, the
        request needs every prompt position computed, or its prompt is shorter than a block):
        two requests with the same key share at least that block of KV."""
        if self.cache is None or needs_every_position(req):
            return None
        b = self.cache.block_tokens
        if not reusable_blocks(len(req.prompt), b):
            return None
        return block_keys(req.prompt, b, 1)[0]

    def would_hit(self, key: bytes | None) -> bool:
        """Whether a lookup of a request with this first block would find something cached."""
        return key is not None and self.cache is not None and self.cache.holds(key)

    def store(self, req: GenerateRequest, prefix: Prefix, hit: Hit) -> None:
        """Cache the prompt's whole blocks from its Prefix: the hit's own blocks as they are
        (one may have been evicted meanwhile by another store), copies of the rest."""
        if self.cache is None:
            return
        b, axis = self.cache.block_tokens, self.axis
        whole = prefix.length // b
        blocks = list(hit.blocks)
        for i in range(len(blocks), whole):
            cut = [slice(None)] * prefix.kv[0].ndim
            cut[axis] = slice(i * b, (i + 1) * b)
            blocks.append([np.array(a[tuple(cut)]) for a in prefix.kv])  # copies
        self.cache.store(req.prompt[: whole * b], blocks)

    def figures(self) -> dict[str, int]:
        """PrefillLoad's prefix_* fields."""
        cache = self.cache
        if cache is None:
            return {}
        return {"prefix_queries": cache.stats.queries, "prefix_hits": cache.stats.hits,
                "prefix_blocks": len(cache), "prefix_bytes": cache.bytes,
                "prefix_evicted": cache.stats.evicted_blocks,
                "prefix_max_bytes": cache.max_bytes, "prefix_check": self.consistent()}

    def consistent(self) -> int:
        """1 when check() holds, 0 when it fails, -1 when off or too large to check each time."""
        cache = self.cache
        if cache is None or len(cache) > CHECK_LIMIT:
            return -1
        if self._checked is not None and self._checked[0] == cache.changes:
            return self._checked[1]
        try:
            cache.check()
            result = 1
        except AssertionError:
            result = 0
        self._checked = (cache.changes, result)
        return result


def needs_every_position(req: GenerateRequest) -> bool:
    """Prompt logprobs score every prompt token, which a cached prefix skips computing."""
    return req.controls is not None and req.controls.prompt_logprobs >= 0 and req.start_seq == 0
