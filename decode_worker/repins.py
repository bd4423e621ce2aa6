"""A stream that moves to another detok worker (the router's Repin), at the decode worker: what
must be kept for a Repin that does not find its request in a slot.

- A Repin can come before its request's prefix (the router's message and prefill's travel apart):
  it waits here and applies when the prefix is inserted.
- A Repin can come after its request ended here (its last tokens went to a detok worker that
  died): the ended request's slot state, every token with it, is kept for that.
Both are forgotten after the state TTL, oldest first.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from decode_worker.slots import Slot, SlotTable
from splitserve.protocol import Repin


class Repins:
    def __init__(self) -> None:
        # Repins of requests whose prefix has not arrived yet: rid -> (when, epoch, detok,
        # from_seq)
        self.waiting: OrderedDict[str, tuple[float, int, int, int]] = OrderedDict()
        # requests that ended here lately: rid -> (when, slot state)
        self.finished: OrderedDict[str, tuple[float, Slot]] = OrderedDict()

    def found(self, msg: Repin, slots: SlotTable) -> list[tuple[Slot, int, int, int]]:
        """The streams of a Repin whose request is here, in a slot or ended lately (its tokens
        are kept), each with its new (epoch, detok, from_seq); the others wait for their
        prefix, and apply once it is inserted (take)."""
        found = []
        for rid, epoch, detok, from_seq in zip(
            msg.request_ids, msg.epochs, msg.detok_indices, msg.from_seqs, strict=False
        ):
            state = slots.get(rid)
            if state is None:
                state = self.ended_state(rid)
            if state is None:  # its prefix is still on its way (or pending)
                self.hold(rid, epoch, detok, from_seq)
            else:
                found.append((state, epoch, detok, from_seq))
        return found

    def hold(self, rid: str, epoch: int, detok: int, from_seq: int) -> None:
        """A Repin for a request whose prefix has not arrived yet."""
        self.waiting.pop(rid, None)  # re-added at the end: the order is by time
        self.waiting[rid] = (time.monotonic(), epoch, detok, from_seq)

    def take(self, rid: str) -> tuple[int, int, int] | None:
        """The (epoch, detok, from_seq) of a Repin that waited for this request's prefix."""
        held = self.waiting.pop(rid, None)
        return None if held is None else held[1:]

    def ended(self, state: Slot) -> None:
        """The request ended here: its state is kept, for a Repin that may still come."""
        self.finished[state.request_id] = (time.monotonic(), state)

    def ended_state(self, rid: str) -> Slot | None:
        kept = self.finished.get(rid)
        return None if kept is None else kept[1]

    def forget_ended(self, rid: str, epoch: int) -> None:
        """An Abort of an ended request at `epoch` (or later): nothing of it is resent."""
        kept = self.finished.get(rid)
        if kept is not None and kept[1].epoch <= epoch:
            del self.finished[rid]

    def prune(self, horizon: float) -> None:
        """Forget what is older than `horizon` (monotonic time)."""
        for kept in (self.waiting, self.finished):  # oldest first: stop at the first young one
            while kept:
                rid, entry = next(iter(kept.items()))
                if entry[0] >= horizon:
                    break
                del kept[rid]
