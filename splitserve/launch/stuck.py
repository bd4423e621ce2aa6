"""Which of a launcher's processes have stopped making progress, by their progress records
(splitserve/progress.py): supervise() kills them (SIGKILL), and the restart policy starts them
again as it does a process that died, so a worker's requests move as a dead worker's do, and a
router's are ended by the workers when its successor says hello (protocol.RouterHello).

A frozen worker (SIGSTOP for 45 s) had been left alone for good: its process had not exited,
so nothing restarted it, while the router answered 503 "a worker is being replaced".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from splitserve.config import LifecycleConfig
from splitserve.progress import progress_path, read_progress, stuck_reason


class StuckWatch:
    """The children of a stack under run_dir, judged against [lifecycle]'s bounds."""

    def __init__(
        self, run_dir: str, lifecycle: LifecycleConfig,
        clock: Callable[[], float] = time.monotonic,
    ):  # fmt: skip
        self.run_dir = run_dir
        self.stuck_timeout_s = lifecycle.stuck_timeout_s
        self.loop_stuck_timeout_s = lifecycle.loop_stuck_timeout_s
        self.clock = clock  # the workers' clock (CLOCK_MONOTONIC): one for the whole host

    def stuck(self, children: Iterable[Any]) -> list[tuple[Any, str]]:
        """(child, why) for each running child whose own record says it is stuck; a child
        without a record of its own pid (a worker still warming up) is not judged."""
        if not self.run_dir:
            return []
        now = self.clock()
        out = []
        for child in children:
            if child.popen.poll() is not None:
                continue
            record = read_progress(progress_path(self.run_dir, child.role, child.index))
            if record is None or record.pid != child.popen.pid:
                continue
            why = stuck_reason(record, now, self.stuck_timeout_s, self.loop_stuck_timeout_s)
            if why is not None:
                out.append((child, why))
        return out
