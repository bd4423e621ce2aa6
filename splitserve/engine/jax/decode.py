"""The JAX engine's decode side: prefixes into slots, steps over the live ones, slots freed.

1. `insert` copies a prefix (maybe a read-only view of a message buffer) into the cache row of
   its slot (slot_rows.py: live slots stay packed at the front), after growing the cache when
   the prefix needs it, and records the row's position, next input token and sampling
   parameters on the host (slot_table.py).
2. `step` runs one compiled step over rows [0, b), b the smallest batch bucket that holds the
   live slots, which first move into rows [0, n) for n live (a live row at or beyond n moves
   into a hole below it): the native kernel's products compute those n rows only
   (programs.LIVE), so one stream costs a batch of one and n live slots in a larger bucket
   about what n rows cost. The cache's capacity follows the live sequences (kv_cache.py). The
   step returns greedy picks directly; only when some live slot samples does a second, per-row
   sampling program run on its logits. Logits controls and grammar masks run in a third
   program on the same logits, only while some live row has them (controlled.py): a batch
   without any runs exactly the programs above. `steps` > 1 runs k steps in one dispatch.
3. `free` marks the slot unused; its stale cache is never visible to other slots (each row
   attends to its own cache only) nor to its next occupant (masked by position).
"""

from __future__ import annotations

import numpy as np

from splitserve.engine.compile.buckets import pick
from splitserve.engine.compile.program_table import ProgramTable
from splitserve.engine.interface import (
    LogitsControls,
    Prefix,
    SamplingParams,
    StepMasks,
    StepOutput,
    TopLogprobs,
)
from splitserve.engine.jax import programs as prog
from splitserve.engine.jax.control_rows import check_controls
from splitserve.engine.jax.controlled import ControlledStep, masked_rows
from splitserve.engine.jax.kv_cache import KvCache
from splitserve.engine.jax.shapes import EngineShapes
from splitserve.engine.jax.slot_table import SlotTable


class DecodeStepper:
    """Decode steps over `cache` and `table`, with the decode side's parameters by batch bucket
    (`params_at`)."""

    def __init__(self, shapes: EngineShapes, programs: ProgramTable, params_at: dict[int, dict],
                 cache: KvCache, table: SlotTable, controlled: ControlledStep):  # fmt: skip
        self.shapes = shapes
        self.programs = programs
        self.params_at = params_at
        self.cache = cache
        self.table = table
        self.controlled_step = controlled
        self.rows_moved = 0  # compaction moves so far (a figure for benchmarks)

    def insert(self, prefix: Prefix, slot: int, sampling: SamplingParams,
               controls: LogitsControls | None = None) -> None:  # fmt: skip
        self.check_slot(slot)
        cache = self.cache
        if controls is not None:
            check_controls(controls, cache.cfg.vocab_size)
            if controls.needs_history and prefix.context is None:
                raise ValueError("these controls need the prompt (Prefix.context)")
        n = prefix.length
        max_seq_len = self.shapes.max_seq_len
        if not 1 <= n <= max_seq_len:
            raise ValueError(f"prefix of {n} tokens; this engine holds 1..{max_seq_len}")
        cfg = cache.cfg
        want = (cfg.layers, n, cfg.kv_heads, cfg.head_dim)
        for arr in prefix.kv:
            if tuple(arr.shape) != want:
                raise ValueError(f"prefix kv shape {arr.shape}, expected {want}")
        ints, floats = prog.sampling_rows(sampling, out_pos=prefix.out_pos + 1)
        # Room for the prefix and the first decoded token's K/V.
        need = pick(self.shapes.decode_buckets, min(n + 1, max_seq_len))
        cache.fit(max(cache.capacity, need))
        width = min(pick(self.shapes.prefill_buckets, n), cache.capacity)
        padded = []
        for arr in prefix.kv:
            out = np.zeros((cfg.layers, width, cfg.kv_heads, cfg.head_dim), cache.dtype)
            out[:, :n] = arr  # copies (and converts) even a read-only frombuffer view
            padded.append(out)
        row = self.table.rows.take(slot)
        cache.write(row, padded[0], padded[1])
        self.table.place(row, ints, floats, prefix.first_token, n, controls, prefix.context,
                         prefix.out_pos)  # fmt: skip

    def generate_many(self, steps: int) -> StepOutput:
        """`steps` decode steps in one dispatch (steps must be one of decode_steps): tokens and
        logprobs [steps, slots]. A slot that finishes midway still advances to the end; the
        caller drops its later tokens and frees it."""
        shapes = self.shapes
        if steps not in shapes.decode_steps:
            raise ValueError(f"{steps} steps per call not compiled; have {shapes.decode_steps}")
        if self.table.controlled:  # each step needs its own mask and the previous step's tokens
            raise ValueError("a live slot has logits controls: one step per call (generate)")
        if steps > 1 and self.table.n_live > shapes.decode_steps_max_live:
            raise ValueError(f"{steps} steps per call compiled for at most "
                             f"{shapes.decode_steps_max_live} live slots")  # fmt: skip
        if not self.multi_step_ready(steps):  # its program still compiling: the same tokens
            outs = [self.step(1) for _ in range(steps)]
            return StepOutput(tokens=np.concatenate([o.tokens for o in outs]),
                              logprobs=np.concatenate([o.logprobs for o in outs]))  # fmt: skip
        return self.step(steps)

    def multi_step_ready(self, steps: int) -> bool:
        """Whether the next dispatch of `steps` steps finds its program (False while it is
        still compiling after a cold start's warm-up: generate_many then runs single steps)."""
        n_live = self.table.n_live
        if steps == 1 or n_live == 0 or not self.programs.any_deferred:
            return True
        batch, target = self._dispatch_shape(n_live, steps)
        # the capacity step() will use: the target (grown at once, or shrunk at this step) or
        # the present one
        capacities = {target, max(target, self.cache.capacity)}
        return not any(self.programs.deferred(("decode", batch, c, steps)) for c in capacities)

    def _dispatch_shape(self, n_live: int, steps: int) -> tuple[int, int]:
        """(batch bucket, capacity bucket the live sequences need) for a dispatch of `steps`."""
        pos = self.table.ints[prog.POS]
        need = min(int(pos[self.table.live].max()) + steps, self.shapes.max_seq_len)
        return pick(self.shapes.batch_buckets, n_live), pick(self.shapes.decode_buckets, need)

    def step(self, steps: int, masks: StepMasks | None = None) -> StepOutput:
        """Run `steps` steps over the live rows; tokens/logprobs [steps, slots] by slot."""
        table, num_slots = self.table, self.shapes.num_slots
        tokens = np.zeros((steps, num_slots), np.int32)
        logprobs = np.zeros((steps, num_slots), np.float32)
        live = table.live
        n_live = int(live.sum())
        if n_live == 0:
            return StepOutput(tokens=tokens, logprobs=logprobs)
        # live rows packed into [0, n_live), not just below the bucket: the kernel's products
        # then compute those rows only (programs.LIVE)
        self._compact(n_live)
        pos = table.ints[prog.POS]
        # A slot at max_seq_len has no room left: callers stop it before; clamping keeps
        # its writes inside its own row if one does not.
        np.minimum(pos, self.shapes.max_seq_len - 1, out=pos)
        batch, target = self._dispatch_shape(n_live, steps)
        self.cache.follow(target)
        # Padding rows [n_live, batch) write junk at position 0 of their own row, inside
        # capacity.
        pos[~live] = 0
        ints = np.ascontiguousarray(table.ints[:, :batch])
        ints[prog.LIVE] = n_live
        program = self.programs.get(("decode", batch, self.cache.capacity, steps))
        params = self.params_at[batch]
        top = None
        if steps == 1:
            tok, lp, logits = self.cache.step(program, params, ints)
            # the pass is dispatched: only now wait for the masks, which overlap it
            masked = masked_rows(masks, batch, table)
            if masked or table.controls.on[:batch][live[:batch]].any():
                tok, lp, top = self.controlled_step.run(table, batch, logits, ints, tok, lp,
                                                        masked)  # fmt: skip
            elif (table.floats[prog.TEMP, :batch][live[:batch]] > 0).any():
                floats = np.ascontiguousarray(table.floats[:, :batch])
                tok, lp = self.programs.get(("sample", batch, False))(logits, ints, floats)
            tok, lp = np.asarray(tok)[None], np.asarray(lp)[None]
        else:
            floats = np.ascontiguousarray(table.floats[:, :batch])
            tok, lp = self.cache.step(program, params, ints, floats)
            tok, lp = np.asarray(tok), np.asarray(lp)  # [steps, batch]
        rows = np.flatnonzero(live[:batch])
        slots = table.rows.slot_at[rows]
        tokens[:, slots] = tok[:, rows]
        logprobs[:, slots] = lp[:, rows]
        if top is not None:
            ids, lps = top
            top = TopLogprobs(np.zeros((num_slots, ids.shape[1]), np.int32),
                              np.zeros((num_slots, ids.shape[1]), np.float32))  # fmt: skip
            top.ids[slots], top.logprobs[slots] = ids[rows], lps[rows]
        if table.controls.on[rows].any():
            table.controls.record(rows.tolist(), tok[-1, rows].tolist())
        table.ints[prog.TOKEN, rows] = tok[-1, rows]
        table.ints[prog.POS, rows] = np.minimum(pos[rows] + steps, self.shapes.max_seq_len)
        table.ints[prog.OUT_POS, rows] += steps
        return StepOutput(tokens=tokens, logprobs=logprobs, top=top)

    def free(self, slot: int) -> None:
        self.check_slot(slot)
        row = self.table.rows.release(slot)
        if row >= 0:
            self.table.clear(row)

    def check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.shapes.num_slots:
            raise ValueError(f"slot {slot} outside 0..{self.shapes.num_slots - 1}")

    def _compact(self, height: int) -> None:
        """Move live rows at or beyond `height` into the holes below it (cache and inputs)."""
        moves = self.table.rows.plan_moves(height)
        for src, dst in moves:
            self.cache.move(src, dst)
            self.table.move(src, dst)
        self.rows_moved += len(moves)
