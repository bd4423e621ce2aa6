"""The decode step of rows with logits controls or a grammar mask.

1. `masked_rows` waits for the step's grammar masks (computed by the worker while the decode
   program runs) and maps them from slots to rows.
2. `ControlledStep.run` gathers the controlled rows' logits from the step's [batch, vocab]
   logits, padded to a count bucket, and runs the "controls" program on them alone
   (controls.py: penalties, bias, bad words, the mask, then sampling and top logprobs); the
   plain rows keep what a batch without controls gives them, and the controlled rows' picks
   are written over theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitserve.engine.compile.buckets import pick
from splitserve.engine.compile.program_table import ProgramTable
from splitserve.engine.interface import StepMasks
from splitserve.engine.jax import controls as ctl
from splitserve.engine.jax import programs as prog
from splitserve.engine.jax.slot_table import SlotTable


def masked_rows(masks: StepMasks | None, batch: int, table: SlotTable) -> dict[int, np.ndarray]:
    """{row: packed allowed bits} of the step's constrained live slots."""
    if masks is None or len(masks.slots) == 0:
        return {}
    bits = masks.wait()
    out = {}
    for i, slot in enumerate(np.asarray(masks.slots).tolist()):
        row = table.rows.row(slot)
        if 0 <= row < batch and table.live[row]:
            out[row] = np.asarray(bits[i], np.int32)
    return out


class ControlledStep:
    """The controls program over a step's controlled rows, padded to one of `counts` rows."""

    def __init__(self, programs: ProgramTable, counts: Sequence[int]):
        self.programs = programs
        self.counts = tuple(counts)

    def run(self, table: SlotTable, batch: int, logits, ints: np.ndarray, tok, lp,
            masked: dict[int, np.ndarray]):  # fmt: skip
        """The step's tokens [batch], logprobs [batch], and (top ids, top logprobs) [batch, 20]
        when some live row asked for alternatives (else None). tok, lp: the decode program's
        greedy picks; ints: the step's packed int inputs [INT_ROWS, batch].

        The controls program runs only on the controlled rows (controls or a mask), gathered
        from the step's logits and padded to a count bucket: over the whole batch every row
        would pay a vocabulary's masking and sorting for one constrained request. The plain
        rows get what a batch without controls gives them (the greedy picks, or the sampling
        program when a plain row samples: exactly a plain batch's), and the controlled rows'
        results are written over theirs."""
        live = table.live[:batch]
        processed = live & table.controls.on[:batch]
        for row in masked:
            processed[row] = True
        rows = np.flatnonzero(processed)
        n = len(rows)
        count = pick(self.counts, n)
        pick_rows = np.full(count, rows[0], np.int32)  # padding repeats a controlled row
        pick_rows[:n] = rows
        floats = np.ascontiguousarray(table.floats[:, :batch])
        inputs = table.controls.inputs(batch, masked, pick_rows)
        sub = self.programs.get(("gather", batch, count))(logits, pick_rows)
        c_tok, c_lp, top_ids, top_lps = self.programs.get(("controls", count, len(inputs) > 6))(
            sub, ints[:, pick_rows], floats[:, pick_rows], *inputs  # fancy indexing: copies
        )
        if (table.floats[prog.TEMP, :batch][live & ~processed] > 0).any():
            tok, lp = self.programs.get(("sample", batch, False))(logits, ints, floats)
        tok, lp = np.array(tok), np.array(lp)  # writable copies
        tok[rows], lp[rows] = np.asarray(c_tok)[:n], np.asarray(c_lp)[:n]
        top = None
        if (table.controls.flags[ctl.TOP_K_LOGPROBS, rows] > 0).any():
            ids, lps = np.asarray(top_ids), np.asarray(top_lps)
            top = (np.zeros((batch, ids.shape[1]), np.int32),
                   np.zeros((batch, ids.shape[1]), np.float32))  # fmt: skip
            top[0][rows], top[1][rows] = ids[:n], lps[:n]
        return tok, lp, top
