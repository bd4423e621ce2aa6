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


def prompt_lengths(smallest: int, largest: int) -> tuple[int, ...]:
    """The padded lengths of a lone prompt's prefill pass: every multiple of `smallest` up to
    8 * smallest, then four steps an octave (n, 1.25n, 1.5n, 1.75n for each power of two n),
    then `largest`.

    Prefill costs what it pads to, about linearly. Powers of two pad a prompt just over one
    (136 tokens, say) to twice its length; these steps pad at most a quarter over (136 to 160),
    and add about three programs an octave.
    """
    out = list(range(smallest, min(8 * smallest, largest), smallest))
    n = 8 * smallest
    while n < largest:
        out += [m for m in (n, n * 5 // 4, n * 3 // 2, n * 7 // 4) if m < largest]
        n *= 2
    out.append(largest)
    return tuple(sorted(set(out)))


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
    lone: Sequence[int], lengths: Sequence[int], counts: Sequence[int], token_budget: int
) -> tuple[tuple[int, int], ...]:
    """(count, padded length) pairs of the prefill programs: one prompt at every `lone`
    length; several at every count bucket and length bucket whose padded tokens fit the
    budget (a batch pads to the coarser `lengths`: a finer list for each count would multiply
    the programs for calls that are rarer than lone ones)."""
    batched = [(c, t) for t in lengths for c in counts if c > 1 and c * t <= token_budget]
    return tuple(sorted({*((1, t) for t in lone), *batched}, key=lambda s: (s[1], s[0])))


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
