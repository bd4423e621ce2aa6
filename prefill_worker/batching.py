"""Which waiting requests the prefill worker runs together in one engine.prefill_batch call.

The queue is served in arrival order. The request at its front always goes next; when it is
plain (no logits controls, no grammar: nothing per request beyond sampling) and finds nothing
in the prefix cache, the plain requests behind it join its call while their prompts fit the
token budget. A request stops the run when it would do better in a call of its own:
- it has controls or a grammar: FirstToken masks its first token and computes its extras;
- the prefix cache holds its start: prefill_cached computes only the rest;
- it starts with the same block as a request already in the call: run next, alone, it reuses
  that request's blocks, stored once the call returns (a burst sharing a system prompt).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from splitserve.protocol import GenerateRequest


def plain(req: GenerateRequest) -> bool:
    return req.controls is None and not req.grammar


def take_batch(
    queue: deque[GenerateRequest],
    budget: int,
    first_block: Callable[[GenerateRequest], bytes | None] = lambda _: None,
    would_hit: Callable[[bytes | None], bool] = lambda _: False,
) -> list[GenerateRequest]:
    """Pop the requests of the next prefill call from the front of the queue (a list of one
    when the first runs alone). first_block gives a request's first cacheable block's key
    (None: none), would_hit whether the cache holds the block of a key."""
    first = queue.popleft()
    batch, tokens = [first], len(first.prompt)
    key = first_block(first)
    if not plain(first) or would_hit(key):
        return batch
    starts = {key} - {None}
    while queue and plain(queue[0]) and tokens + len(queue[0].prompt) <= budget:
        key = first_block(queue[0])
        if key in starts or would_hit(key):
            break
        if key is not None:
            starts.add(key)
        tokens += len(queue[0].prompt)
        batch.append(queue.popleft())
    return batch
