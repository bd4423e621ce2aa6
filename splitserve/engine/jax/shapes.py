"""The shapes a JAX engine compiles for, settled once from its slots, its longest sequence and the
buckets it is given: every size it meets pads up to one of these (compile/buckets.py), so a
handful of programs serve every prompt length, batch and cache length."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from splitserve.engine.compile.buckets import (
    batch_buckets,
    capacity_buckets,
    check_buckets,
    length_buckets,
    pick,
    prefill_shapes,
    prompt_lengths,
)


@dataclass(frozen=True)
class EngineShapes:
    num_slots: int
    max_seq_len: int
    # the padded lengths of a batch of prompts, of a prefix-cache continuation (cached and new
    # parts) and of a prefix decode inserts
    prefill_buckets: tuple[int, ...]
    prompt_lengths: tuple[int, ...]  # a lone prompt's padded lengths (finer: see engine_shapes)
    decode_buckets: tuple[int, ...]  # the decode cache's capacities
    batch_buckets: tuple[int, ...]  # the decode step's batch sizes
    # how many controlled rows a decode step's controls program runs on (the count padded up)
    control_counts: tuple[int, ...]
    prefill_counts: tuple[int, ...]  # prompts per prefill call
    prefill_shapes: tuple[tuple[int, int], ...]  # (count, padded length) of the prefill programs
    prefill_batch_tokens: int  # the padded tokens of one prefill call, at most
    decode_steps: tuple[int, ...]  # decode steps per dispatch
    decode_steps_max_live: int  # several steps a dispatch only while at most this many are live
    chunk_batch: int  # the largest batch bucket that has the k-step programs

    def prefill_shape(self, prompts: int, longest: int) -> tuple[int, int]:
        """(count, padded length) of a prefill call of `prompts` prompts, `longest` the longest."""
        count = pick(self.prefill_counts, prompts)
        lengths = self.prompt_lengths if count == 1 else self.prefill_buckets
        return count, pick(lengths, longest)

    def fits(self, prompts: int, longest: int) -> bool:
        """Whether one compiled prefill call takes these prompts."""
        if prompts > self.prefill_counts[-1]:
            return False
        return self.prefill_shape(prompts, longest) in self.prefill_shapes


def engine_shapes(
    num_slots: int,
    max_seq_len: int,
    *,
    prefill_buckets: Sequence[int] | None = None,
    decode_buckets: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
    prefill_counts: Sequence[int] = (1,),
    prefill_batch_tokens: int = 1024,
    decode_steps: Sequence[int] = (1,),
    decode_steps_max_live: int | None = None,
) -> EngineShapes:
    """The shapes of an engine of num_slots slots of max_seq_len positions; buckets not given
    take the defaults of compile/buckets.py."""
    prefill = check_buckets(
        "prefill", prefill_buckets or length_buckets(16, max_seq_len), max_seq_len
    )
    # a lone prompt pads to finer lengths (compile/buckets.py: a pass costs what it pads to);
    # named buckets are used as they are. Batches, continuations and decode's insert widths
    # keep the coarse buckets, whose programs multiply with their number.
    lone = prefill if prefill_buckets else prompt_lengths(16, max_seq_len)
    batches = check_buckets("batch", batch_sizes or batch_buckets(num_slots), num_slots)
    counts = tuple(sorted({1, *prefill_counts}))
    # several steps a dispatch only while at most this many slots are live (None or 0: any);
    # the k-step programs exist for the batch buckets that hold that many
    max_live = max(1, min(decode_steps_max_live or num_slots, num_slots))
    return EngineShapes(
        num_slots=num_slots,
        max_seq_len=max_seq_len,
        prefill_buckets=prefill,
        prompt_lengths=lone,
        decode_buckets=check_buckets(
            "decode", decode_buckets or capacity_buckets(64, max_seq_len), max_seq_len
        ),
        batch_buckets=batches,
        # 1, 2, 4, ... whatever the batch buckets, so one constrained request among many plain
        # ones costs a program over one row, not the batch
        control_counts=tuple(sorted({*length_buckets(1, num_slots), *batches})),
        prefill_counts=counts,
        prefill_shapes=prefill_shapes(lone, prefill, counts, prefill_batch_tokens),
        prefill_batch_tokens=prefill_batch_tokens,
        decode_steps=tuple(sorted({1, *decode_steps})),
        decode_steps_max_live=max_live,
        chunk_batch=pick(batches, max_live),
    )
