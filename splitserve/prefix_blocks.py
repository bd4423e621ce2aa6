"""Block keys of a prompt for prefix reuse: the prompt cut into blocks of block_tokens tokens, each
block keyed by a hash chained over the blocks before it, so that a key names a block *and*
everything before it (two prompts share a key exactly when they share that whole prefix).

The prefill worker's cache (prefill_worker/prefix_cache.py) and the router's placement
(router/prefix_affinity.py) compute the same keys: blake2b of the previous key and the block's
token ids as little-endian int32, stable across processes and runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

ROOT_KEY = b"splitserve-prefix-v1"


def block_keys(tokens: Sequence[int], block_tokens: int, limit: int | None = None) -> list[bytes]:
    """Keys of the prompt's whole blocks (a partial last block has none), at most `limit`."""
    whole = len(tokens) // block_tokens
    if limit is not None:
        whole = min(whole, limit)
    ids = np.asarray(tokens[: whole * block_tokens], dtype="<i4")
    keys, key = [], ROOT_KEY
    for b in range(whole):
        block = ids[b * block_tokens : (b + 1) * block_tokens]
        key = hashlib.blake2b(key + block.tobytes(), digest_size=16).digest()
        keys.append(key)
    return keys


def reusable_blocks(prompt_tokens: int, block_tokens: int) -> int:
    """Whole blocks a prompt may take from a cache: at least one token must be computed, since
    the first output token is sampled from the last prompt position's logits."""
    return max(0, (prompt_tokens - 1) // block_tokens)
