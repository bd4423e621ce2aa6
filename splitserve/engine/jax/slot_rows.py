"""Where each decode slot lives in the batch: the engine's rows, kept packed at the front.

The worker names slots 0..num_slots-1 and keeps them as long as a request lives; the engine
stores a slot's cache and inputs in a *row* of its batch buffers, and runs the step over
rows [0, b) with b the smallest batch bucket holding the live slots. A new slot takes the
lowest free row, and before a step the engine moves any live row at or beyond the live count
n into a free row below it (`plan_moves(n)`), so the live rows are exactly [0, n): the native
kernel's products compute those rows only, and the step costs n rows rather than b. A row moves
only when a finished request leaves a hole below a live row: at most one move per request.
Pure bookkeeping: the engine copies the cache rows itself.
"""

from __future__ import annotations

import numpy as np


class SlotRows:
    """slot -> row and row -> slot for num_slots slots (-1: none)."""

    def __init__(self, num_slots: int):
        self.row_of = np.full(num_slots, -1, np.int64)  # [slots]
        self.slot_at = np.full(num_slots, -1, np.int64)  # [rows]

    @property
    def live(self) -> int:
        return int((self.slot_at >= 0).sum())

    def row(self, slot: int) -> int:
        """The slot's row, or -1 when it is free."""
        return int(self.row_of[slot])

    def take(self, slot: int) -> int:
        """The slot's row, assigning the lowest free row when it has none."""
        row = int(self.row_of[slot])
        if row < 0:
            row = int(np.flatnonzero(self.slot_at < 0)[0])
            self.row_of[slot] = row
            self.slot_at[row] = slot
        return row

    def release(self, slot: int) -> int:
        """Free the slot; its former row, or -1 when it held none."""
        row = int(self.row_of[slot])
        if row >= 0:
            self.row_of[slot] = -1
            self.slot_at[row] = -1
        return row

    def plan_moves(self, batch: int) -> list[tuple[int, int]]:
        """(from row, to row) moves, applied in order, that put every live slot below `batch`
        (which must hold them all); the table already reflects them when this returns."""
        high = [int(r) for r in np.flatnonzero(self.slot_at[batch:] >= 0) + batch]
        holes = [int(r) for r in np.flatnonzero(self.slot_at[:batch] < 0)]
        if len(high) > len(holes):
            raise ValueError(f"{self.live} live slots do not fit a batch of {batch}")
        moves = list(zip(high, holes, strict=False))
        for src, dst in moves:
            slot = self.slot_at[src]
            self.slot_at[dst], self.slot_at[src] = slot, -1
            self.row_of[slot] = dst
        return moves
