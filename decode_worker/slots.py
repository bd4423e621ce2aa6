"""The decode worker's slot table: which request holds which engine slot.

One structure owns both views, slot index -> live request and request id -> slot index, so they
cannot drift apart. Pure bookkeeping: the worker tells the engine (insert, free) itself.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter

from splitserve.protocol import StopCriteria
from splitserve.stopping import token_finish


@dataclass
class Slot:
    """A live request in a decode slot (always truthy, which live() relies on)."""

    request_id: str
    epoch: int
    detok_index: int
    stop: StopCriteria
    next_seq: int  # output position of the next token
    context_len: int  # prompt + output tokens so far
    # every token this worker produced for the request (from output position first_seq on), kept
    # so that a stream moved to another detok worker (Repin) loses none: 4 + 8 bytes a token
    first_seq: int = 0
    tokens: array = field(default_factory=lambda: array("i"))
    logprobs: array = field(default_factory=lambda: array("d"))
    finish: int = 0  # TokenFinish of its last token, once it has finished
    # alternatives asked for per token, and those of each token kept (for a Repin), when > 0
    top_logprobs: int = 0
    tops: list[tuple[list[int], list[float]]] = field(default_factory=list)
    router_incarnation: int = 0  # of the router that owns the request (protocol.RouterHello)

    def advance(self, token: int, logprob: float, max_seq_len: int) -> tuple[int, int]:
        """Its next token, kept in its history: (its output position, its TokenFinish)."""
        seq = self.next_seq
        self.next_seq += 1
        finish = token_finish(self.stop, token, seq + 1, self.context_len, max_seq_len)
        self.context_len += 1
        self.tokens.append(token)
        self.logprobs.append(logprob)
        return seq, finish


_state = itemgetter(1)


class SlotTable:
    def __init__(self, num_slots: int):
        self._slots: list[Slot | None] = [None] * num_slots
        self._index: dict[str, int] = {}

    @property
    def capacity(self) -> int:
        return len(self._slots)

    @property
    def free_count(self) -> int:
        return len(self._slots) - len(self._index)

    def __len__(self) -> int:
        """Live slots."""
        return len(self._index)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._index

    def get(self, request_id: str) -> Slot | None:
        index = self._index.get(request_id)
        return None if index is None else self._slots[index]

    def take(self, slot: Slot) -> int:
        """Put slot in the lowest free index and return it. ValueError when none is free or the
        request already holds one."""
        if slot.request_id in self._index:
            raise ValueError(f"{slot.request_id} already holds slot {self._index[slot.request_id]}")
        if len(self._index) == len(self._slots):
            raise ValueError("no free slot")
        index = self._slots.index(None)
        self._slots[index] = slot
        self._index[slot.request_id] = index
        return index

    def release(self, request_id: str) -> int | None:
        """Free the request's slot; its index, or None when it held none."""
        index = self._index.pop(request_id, None)
        if index is not None:
            self._slots[index] = None
        return index

    def live(self) -> Iterator[tuple[int, Slot]]:
        """(index, slot) of every live slot, in slot order. Releasing slots while iterating is
        allowed (a released later slot is skipped). The filtering runs in C, so this costs no more
        than a plain loop over the slots: the decode step runs it every few milliseconds."""
        return filter(_state, enumerate(self._slots))
