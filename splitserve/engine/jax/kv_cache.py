"""The decode slots' K/V on the device: one buffer pair per layer, a row per slot.

XLA on CPU copies the slices of a stacked buffer before using them, hence a pair per layer:
keys [rows, kv_heads, head_dim, capacity] (transposed, so q.K reads along the last axis),
values [rows, kv_heads, capacity, head_dim]. The steps donate the buffers, so the new K/V are
written in place.

The capacity (positions per row) follows the smallest capacity bucket that covers the longest
live sequence, by a compiled copy, so attention costs what the live sequences need, not
max_seq_len. It grows at once; it shrinks only once the live sequences have needed less for
`shrink_after_steps` steps in a row: a copy of a large cache stalls a step for as long as
several steps take, and under a steady load the longest sequence keeps ending and another soon
takes its place.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from splitserve.engine.compile.program_table import ProgramTable
from splitserve.engine.model.llama_config import LlamaConfig


def cache_shapes(cfg: LlamaConfig, rows: int, capacity: int) -> tuple[tuple, tuple]:
    """One layer's (keys, values) buffer shapes."""
    k = (rows, cfg.kv_heads, cfg.head_dim, capacity)  # keys transposed
    v = (rows, cfg.kv_heads, capacity, cfg.head_dim)
    return k, v


class KvCache:
    """The K/V buffers of `rows` rows, at one of `capacities` (ascending) positions a row; the
    "insert", "move" and "resize" programs of `programs` write and copy them."""

    def __init__(self, cfg: LlamaConfig, rows: int, dtype: np.dtype, capacities: Sequence[int],
                 programs: ProgramTable, shrink_after_steps: int):  # fmt: skip
        self.cfg = cfg
        self.rows = rows
        self.dtype = np.dtype(dtype)
        self.capacities = tuple(capacities)
        self.programs = programs
        self.shrink_after_steps = shrink_after_steps
        self._steps_over = 0  # consecutive steps whose live sequences needed a smaller cache
        self.capacity = self.capacities[0]
        self.k, self.v = self._empty(self.capacity)

    def _empty(self, capacity: int) -> tuple[list, list]:
        k, v = cache_shapes(self.cfg, self.rows, capacity)
        layers, dt = range(self.cfg.layers), self.dtype
        return [jnp.zeros(k, dt) for _ in layers], [jnp.zeros(v, dt) for _ in layers]

    def write(self, row: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v [layers, width, kv_heads, head_dim] into positions [0, width) of `row`."""
        program = self.programs.get(("insert", k.shape[1], self.capacity))
        row_arg = np.int32(row)
        for layer in range(self.cfg.layers):
            self.k[layer], self.v[layer] = program(self.k[layer], self.v[layer], k[layer],
                                                   v[layer], row_arg)  # fmt: skip

    def move(self, src: int, dst: int) -> None:
        """Every layer's row `src` copied to row `dst`."""
        program = self.programs.get(("move", self.capacity))
        self.k, self.v = program(self.k, self.v, np.int32(src), np.int32(dst))

    def step(self, program: jax.stages.Compiled, params: dict, *inputs) -> list:
        """Run a decode program, which takes (params, keys, values, *inputs) and returns the
        new (keys, values) first: the cache keeps those, the rest is returned."""
        self.k, self.v, *out = program(params, self.k, self.v, *inputs)
        return out

    def follow(self, need: int) -> None:
        """Grow to `need` now; shrink to it only after it has held for shrink_after_steps."""
        if need >= self.capacity:
            self._steps_over = 0
            self.fit(need)
            return
        self._steps_over += 1
        if self._steps_over >= self.shrink_after_steps:
            self._steps_over = 0
            self.fit(need)

    def fit(self, target: int) -> None:
        """Grow or shrink the cache one bucket at a time until its capacity is `target`."""
        while self.capacity != target:
            i = self.capacities.index(self.capacity)
            nxt = self.capacities[i + 1 if target > self.capacity else i - 1]
            program = self.programs.get(("resize", self.capacity, nxt))
            resized = [program(k, v) for k, v in zip(self.k, self.v, strict=True)]
            self.k = [k for k, _ in resized]
            self.v = [v for _, v in resized]
            self.capacity = nxt
