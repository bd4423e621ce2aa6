"""How many decode slots `num_slots = "auto"` gives an engine: as many as a KV memory budget holds.

A slot's cache can grow to max_seq_len positions, so a budget of B bytes holds
B / (KV bytes per position x max_seq_len) slots that all reach full length at once. The count
is rounded down to a power of two (the decode batch buckets are powers of two: a count just
above one would add a program for a few rows) and held to `most`, the requests the router
runs at once (slots beyond it would never fill).

For example the default model's float32 cache takes 90 MiB a slot at 2,048 positions, so the
default 2 GiB gives it 16 slots; the 7M checkpoint's takes 8 MiB, so it gets 64 (measured in
lab/benchmarks.md, "Decode slots sized from the KV budget").
"""

from __future__ import annotations

# the fake engine keeps no KV cache to size: what "auto" gives it
FAKE_ENGINE_SLOTS = 16


def auto_slots(kv_bytes_per_token: int, max_seq_len: int, budget_bytes: int, most: int) -> int:
    """The largest power of two of slots whose caches fit `budget_bytes` at `max_seq_len`
    positions each, at most `most`, and at least one (a budget below one slot still serves)."""
    if kv_bytes_per_token < 1 or max_seq_len < 1 or most < 1:
        raise ValueError(f"cannot size slots from {kv_bytes_per_token} KV bytes a position, "
                         f"{max_seq_len} positions, at most {most}")  # fmt: skip
    fits = min(budget_bytes // (kv_bytes_per_token * max_seq_len), most)
    slots = 1
    while slots * 2 <= fits:
        slots *= 2
    return slots
