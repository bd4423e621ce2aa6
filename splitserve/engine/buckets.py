"""The compiled shapes an engine runs: every size is padded up to the smallest bucket that holds it,
so a handful of programs serve every prompt length, batch and cache length."""

from __future__ import annotations

from collections.abc import Sequence


def length_buckets(smallest: int, largest: int) -> tuple[int, ...]:
    """Powers of two from `smallest` below `largest`, then `largest` itself."""
    out, n = [], smallest
    while n < largest:
        out.append(n)
        n *= 2
    out.append(largest)
    return tuple(out)


def capacity_buckets(smallest: int, largest: int) -> tuple[int, ...]:
    """Decode cache capacities: powers of two from `smallest` and, from 2 * smallest on,
    the midpoints 1.5x between them (64, 128, 192, 256, 384, ...), then `largest`.

    Attention is memory-bound and reads the whole capacity every step, so the finer steps
    waste at most a third of it instead of half, for a few more compiled programs.
    """
    out: list[int] = []
    n = smallest
    while n < largest:
        out.append(n)
        if n >= 2 * smallest and n * 3 // 2 < largest:
            out.append(n * 3 // 2)
        n *= 2
    out.append(largest)
    return tuple(out)


def batch_buckets(num_slots: int) -> tuple[int, ...]:
    """Decode batch sizes: 1, 2, 4, ... below num_slots, then num_slots. A step over b live
    slots runs the smallest that holds b, so one stream pays for a batch of one."""
    return length_buckets(1, num_slots)


def prefill_shapes(
    lengths: Sequence[int], counts: Sequence[int], token_budget: int
) -> tuple[tuple[int, int], ...]:
    """(count, padded length) pairs of the batched prefill programs: every count bucket at
    every length bucket whose padded tokens fit the budget; one prompt always fits."""
    return tuple(
        (c, t) for t in lengths for c in counts if c == 1 or c * t <= token_budget
    )


def pick(buckets: Sequence[int], n: int) -> int:
    """The smallest bucket >= n."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"size {n} exceeds the largest bucket {buckets[-1]}")


def check_buckets(name: str, buckets: Sequence[int], largest: int) -> tuple[int, ...]:
    b = tuple(buckets)
    if not b or list(b) != sorted(set(b)) or b[0] < 1 or b[-1] != largest:
        raise ValueError(f"{name} buckets {b} must ascend from >= 1 and end at {largest}")
    return b
