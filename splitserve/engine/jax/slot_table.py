"""The decode rows' state on the host: which slot each row holds (slot_rows.py), the packed
inputs a step takes (programs.py: one int32 and one float32 array, a column per row), which rows
are live, and their logits controls (control_rows.py). Rows follow the device cache's rows:
a slot's row is where its K/V are (kv_cache.py)."""

from __future__ import annotations

import numpy as np

from splitserve.engine.interface import LogitsControls
from splitserve.engine.jax import programs as prog
from splitserve.engine.jax.control_rows import ControlRows
from splitserve.engine.jax.slot_rows import SlotRows


class SlotTable:
    """num_slots rows of a model of vocab_size tokens."""

    def __init__(self, num_slots: int, vocab_size: int):
        self.rows = SlotRows(num_slots)
        self.ints = np.zeros((prog.INT_ROWS, num_slots), np.int32)  # TOKEN, POS, ...
        self.floats = np.zeros((prog.FLOAT_ROWS, num_slots), np.float32)  # TEMP, TOP_P
        self.floats[prog.TOP_P] = 1.0
        self.live = np.zeros(num_slots, bool)  # by row
        self.controls = ControlRows(num_slots, vocab_size)  # by row

    def place(self, row: int, ints: np.ndarray, floats: np.ndarray, first_token: int,
              length: int, controls: LogitsControls | None, context: np.ndarray | None,
              out_pos: int) -> None:  # fmt: skip
        """A prefix of `length` tokens in `row` (a slot's: SlotRows.take), with its packed
        sampling rows (prog.sampling_rows) and its controls."""
        self.ints[:, row] = ints[:, 0]
        self.ints[prog.TOKEN, row] = first_token
        self.ints[prog.POS, row] = length
        self.floats[:, row] = floats[:, 0]
        self.live[row] = True
        if controls is not None:
            self.controls.set(row, controls, context, out_pos, first_token)
        else:
            self.controls.clear(row)

    def clear(self, row: int) -> None:
        self.live[row] = False
        self.ints[:, row] = 0
        self.floats[:, row] = (0.0, 1.0)  # greedy, so it never forces the sampling variant
        self.controls.clear(row)

    def move(self, src: int, dst: int) -> None:
        """Row src's inputs and controls to row dst (SlotRows.plan_moves moved the slot)."""
        self.ints[:, dst] = self.ints[:, src]
        self.floats[:, dst] = self.floats[:, src]
        self.controls.move(src, dst)
        self.live[dst] = True
        self.clear(src)

    @property
    def n_live(self) -> int:
        return int(self.live.sum())

    @property
    def controlled(self) -> bool:
        """Some live row has logits controls."""
        return bool(self.controls.on[self.live].any())
