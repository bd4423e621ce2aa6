"""The prefix cache's bookkeeping: a lookup finds exactly the longest cached run of whole blocks
(never the prompt's last token), the arrays it returns are the ones stored for those very tokens,
and under any sequence of stores and lookups with a small byte bound the invariants hold: the
bound, every block's ancestors cached (each block reachable from its key), counts consistent."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prefill_worker.prefix_cache import PrefixCache
from splitserve.prefix_blocks import block_keys, reusable_blocks

BLOCK = 4


def _arrays(tokens: list[int], b: int) -> list[np.ndarray]:
    """What an engine would hand over for block b of a prompt: here its own token ids, so that a
    lookup can be checked to return the very block it names."""
    ids = np.asarray(tokens[b * BLOCK : (b + 1) * BLOCK], np.float32)
    return [ids.copy(), -ids]


def _blocks_of(tokens: list[int]) -> list[list[np.ndarray]]:
    return [_arrays(tokens, b) for b in range(reusable_blocks(len(tokens), BLOCK))]


def test_block_keys_chain_over_the_whole_prefix():
    a, b = [1, 2, 3, 4, 5, 6, 7, 8], [9, 2, 3, 4, 5, 6, 7, 8]
    assert block_keys(a, 4)[1] != block_keys(b, 4)[1]  # same second block, other first
    assert block_keys(a + [0], 4) == block_keys(a, 4)  # a partial block has no key
    assert block_keys(a, 4, limit=1) == block_keys(a, 4)[:1]


def test_a_lookup_finds_the_longest_cached_run_and_never_the_last_token():
    cache = PrefixCache(BLOCK, 1 << 20)
    prompt = list(range(1, 13))  # 12 tokens: 3 whole blocks, of which 2 are reusable
    assert cache.lookup(prompt)[0] == 0
    cache.store(prompt, _blocks_of(prompt))
    cached, arrays = cache.lookup(prompt)
    assert cached == 8 and len(arrays) == 2
    assert cache.lookup(prompt[:9] + [99, 98, 97])[0] == 8  # shares the first two blocks
    assert cache.lookup([0] + prompt[1:])[0] == 0  # differs in the first token
    assert cache.stats.hits == 16 and cache.stats.queries == 48


prompts = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 5), min_size=1, max_size=14)),
    min_size=1, max_size=60,
)  # fmt: skip
SYSTEM = [[7, 7, 7, 7, 1, 2, 3, 4], [7, 7, 7, 7, 9, 9], [5, 5, 5, 5, 5, 5, 5, 5, 5], []]


@settings(max_examples=200, deadline=None)
@given(prompts, st.integers(0, 12))
def test_invariants_hold_under_any_stores_and_lookups(requests, bound_blocks):
    block_bytes = 2 * BLOCK * 4  # two float32 arrays of BLOCK
    cache = PrefixCache(BLOCK, bound_blocks * block_bytes)
    for system, user in requests:
        tokens = SYSTEM[system] + user
        cached, arrays = cache.lookup(tokens)
        assert cached % BLOCK == 0 and cached < len(tokens)
        for b, got in enumerate(arrays):  # the very blocks of these tokens
            for want, have in zip(_arrays(tokens, b), got, strict=True):
                np.testing.assert_array_equal(want, have)
        if len(user) % 3:  # some requests are aborted before their prefill stores anything
            cache.store(tokens, _blocks_of(tokens))
        cache.check()
    assert cache.bytes <= cache.max_bytes


def test_stores_and_clears_count_as_changes_and_lookups_do_not():
    cache = PrefixCache(BLOCK, 10**6)
    tokens = list(range(13))
    cache.store(tokens, _blocks_of(tokens))
    assert cache.changes == 1
    cache.lookup(tokens)
    assert cache.changes == 1
    cache.clear()
    assert cache.changes == 2


def test_the_load_reports_check_is_redone_only_after_a_change(monkeypatch):
    """The invariant check walks every block: a load report (8 a second) runs it only when the
    cache changed since the last one, and a broken invariant still shows at the next change."""
    from prefill_worker.prefix_reuse import PrefixReuse
    from splitserve.config import ModelConfig
    from splitserve.engine.fake.engine import FakeEngine

    reuse = PrefixReuse(FakeEngine(2, 256, 1000), ModelConfig(path="random:tiny"))
    cache = reuse.cache
    calls = []
    real_check = cache.check
    monkeypatch.setattr(cache, "check", lambda: calls.append(1) or real_check())
    tokens = list(range(40))
    cache.store(tokens, [[np.zeros(3, np.float32)] for _ in range(2)])
    assert [reuse.consistent() for _ in range(5)] == [1] * 5
    assert len(calls) == 1
    cache.bytes += 1  # the invariants break; nothing is re-checked until the cache changes
    assert reuse.consistent() == 1
    cache.store(list(range(100, 140)), [[np.zeros(3, np.float32)] for _ in range(2)])
    assert reuse.consistent() == 0
    assert len(calls) == 2
