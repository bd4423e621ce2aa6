"""The prefill worker's prefix cache: KV blocks of a fixed token count, keyed by a hash chained over
the blocks (splitserve/prefix_blocks.py), bounded in bytes, least recently used first out.

1. lookup(tokens) finds the prompt's longest cached run of whole blocks from its start (never the
   last token: the first output token is sampled from its logits) and returns their arrays.
2. The engine computes only the rest; store(tokens, arrays) adds the prompt's blocks not cached.
3. Over the byte bound, the least recently used block goes. A lookup touches a run's blocks from
   the last to the first, so a block is never older than its descendants and eviction takes
   leaves first: a cached block's whole chain of ancestors is cached (every block is reachable
   from its key), which check() verifies.

A block's arrays are whatever the engine hands over (e.g. K and V, each [layers, block_tokens,
kv_heads, head_dim]); the cache only counts their bytes. Pure bookkeeping, no sockets, no model
math; it lives as long as the worker process, so a restart leaves nothing referenced.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitserve.prefix_blocks import block_keys, reusable_blocks


@dataclass
class _Block:
    parent: bytes | None  # the key of the block before it (None for a prompt's first block)
    arrays: list[np.ndarray]
    nbytes: int


@dataclass
class CacheStats:
    queries: int = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
    hits: int = 0  # of them, found cached (prefix_cache_hits)
    evicted_blocks: int = 0


class PrefixCache:
    def __init__(self, block_tokens: int, max_bytes: int):
        if block_tokens < 1 or max_bytes < 0:
            raise ValueError("the prefix cache needs block_tokens >= 1 and max_bytes >= 0")
        self.block_tokens = block_tokens
        self.max_bytes = max_bytes
        self.bytes = 0
        self.changes = 0  # stores and clears so far: what has been checked need not be again
        self.stats = CacheStats()
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()  # least recently used first
        self._children: dict[bytes, int] = {}  # key -> its cached children

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, tokens: Sequence[int]) -> tuple[int, list[list[np.ndarray]]]:
        """(cached prompt tokens, the arrays of each cached block in order)."""
        keys = block_keys(tokens, self.block_tokens,
                          reusable_blocks(len(tokens), self.block_tokens))  # fmt: skip
        run: list[bytes] = []
        for key in keys:
            if key not in self._blocks:
                break
            run.append(key)
        for key in reversed(run):  # ancestors end up more recent than their descendants
            self._blocks.move_to_end(key)
        cached = len(run) * self.block_tokens
        self.stats.queries += len(tokens)
        self.stats.hits += cached
        return cached, [self._blocks[key].arrays for key in run]

    def holds(self, key: bytes) -> bool:
        """Whether the block of this key is cached (a look that counts nothing and touches no
        block: a block cached means its whole chain of ancestors is)."""
        return key in self._blocks

    def store(self, tokens: Sequence[int], blocks: list[list[np.ndarray]]) -> None:
        """Cache the prompt's blocks: blocks[i] holds the arrays of whole block i (those already
        cached are skipped), then evict down to the byte bound."""
        keys = block_keys(tokens, self.block_tokens, len(blocks))
        self.changes += 1
        parent: bytes | None = None
        for key, arrays in zip(keys, blocks, strict=False):
            if key in self._blocks:
                self._blocks.move_to_end(key)
            else:
                nbytes = sum(a.nbytes for a in arrays)
                if nbytes > self.max_bytes:
                    break  # a block over the whole bound is never kept (nor anything after it)
                self._blocks[key] = _Block(parent, arrays, nbytes)
                self.bytes += nbytes
                if parent is not None:
                    self._children[parent] = self._children.get(parent, 0) + 1
            parent = key
        for key in reversed(keys[: len(blocks)]):  # as lookup: ancestors the most recent
            if key in self._blocks:
                self._blocks.move_to_end(key)
        self._evict()

    def clear(self) -> None:
        self.changes += 1
        self._blocks.clear()
        self._children.clear()
        self.bytes = 0

    def _evict(self) -> None:
        while self.bytes > self.max_bytes:
            # the least recently used leaf (a block with cached children waits for them)
            key = next(k for k in self._blocks if not self._children.get(k))
            block = self._blocks.pop(key)
            self.bytes -= block.nbytes
            self.stats.evicted_blocks += 1
            if block.parent is not None:
                left = self._children[block.parent] - 1
                if left:
                    self._children[block.parent] = left
                else:
                    del self._children[block.parent]

    def check(self) -> None:
        """The invariants (tests call this): the byte count is the blocks' bytes, within the
        bound; every block's parent is cached (so every block is reachable from its key by a
        lookup of its prompt); the child counts match."""
        assert self.bytes == sum(b.nbytes for b in self._blocks.values()) <= self.max_bytes
        children: dict[bytes, int] = {}
        for block in self._blocks.values():
            if block.parent is not None:
                assert block.parent in self._blocks, "a block whose parent was evicted"
                children[block.parent] = children.get(block.parent, 0) + 1
        assert children == self._children
