"""Where the suite's processes run: the decode worker owns the first CPU; the prefill, detok and
router processes, the workers' zmq I/O threads and the load generator share the others."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Cpus:
    """The CPUs this process may use, taken once at start, before it narrows its own."""

    all: tuple[int, ...]

    @classmethod
    def of_this_process(cls) -> Cpus:
        return cls(tuple(sorted(os.sched_getaffinity(0))))

    def layout(self) -> tuple[list[int], list[int]] | None:
        """(the decode worker's CPUs, everyone else's), or None on a single-CPU host."""
        return ([self.all[0]], list(self.all[1:])) if len(self.all) > 1 else None
