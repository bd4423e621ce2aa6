"""Cores shared on one host by the prefill and decode workers of a stack ([model] share_cores).

The decode engine's kernels run each layer as a team of threads, one per core by default, and
the team waits at each phase for its slowest member. When a prefill worker on the same host
runs a prompt, it takes one of those cores: the member that loses it holds up the layer while
the others spin, and the spinning takes CPU the prompt needs. So each prefill worker marks, in
a small file of the run directory, whether it is running prompts; a decode worker hands the
file to its engine (Engine.share_cores), whose kernels read the marks at each call and run on
the cores the prefill workers leave while any is set, on all of them otherwise.

The file, `<run_dir>/prefill-marks`: MARKS bytes, byte i for prefill worker i, 1 while it runs
prompts. Only processes that share a run directory on one host map the same file, so workers
on different hosts never hold each other back. A prefill worker clears its mark when it starts
and when it stops; one that dies while marked leaves it set until it is restarted (meanwhile
the decode kernels run on fewer threads, nothing worse). Threads mode runs every role in one
process, whose kernel settings the prefill engine shares too, so it does not share this way.
"""

from __future__ import annotations

import logging
import mmap
import os

from splitserve.config import ClusterConfig
from splitserve.engine import prefill_threads
from splitserve.engine.interface import Engine

log = logging.getLogger(__name__)

FILE = "prefill-marks"
MARKS = 256  # prefill workers one host's file tracks; a later index does not mark


class PrefillMarks:
    """The run directory's marks file, mapped."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_size < MARKS:  # a new file (its makers may race: same size)
                os.ftruncate(fd, MARKS)
            self.map = mmap.mmap(fd, MARKS)
        finally:
            os.close(fd)

    def mark(self, index: int, busy: bool) -> None:
        """Prefill worker `index` is running prompts (or no longer is)."""
        if 0 <= index < MARKS:
            self.map[index] = 1 if busy else 0

    def marked(self) -> list[int]:
        """The prefill workers marked now."""
        return [i for i, b in enumerate(self.map[:MARKS]) if b]


def open_marks(config: ClusterConfig) -> PrefillMarks | None:
    """This stack's marks file, or None where cores are not shared: share_cores off, threads
    mode, no run directory (a file with tcp [addresses] and no run_dir), or prefill or decode
    pinned to CPUs of their own ([cluster.cpus]: the operator has placed them)."""
    model = config.model
    pinned = "prefill" in config.cpus or "decode" in config.cpus
    if not model.share_cores or config.mode != "processes" or not config.run_dir or pinned:
        return None
    return PrefillMarks(os.path.join(config.run_dir, FILE))


def share_with_prefill(config: ClusterConfig, engine: Engine) -> PrefillMarks | None:
    """A decode worker's side: its engine follows the marks, if there are cores to leave."""
    marks = open_marks(config)
    if marks is None:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model, cpus = config.model, cpus or 1
    threads = threads_while_marked(model.cpu_threads, prefill_threads(model, cpus), cpus)
    if threads >= (model.cpu_threads or cpus):
        return None  # decode already leaves prefill its cores
    engine.share_cores(marks.map, threads)
    log.info("decode kernels on %d thread(s) while a prefill worker runs prompts (of %d)",
             threads, model.cpu_threads or cpus)  # fmt: skip
    return marks


def threads_while_marked(decode_threads: int, prefill_threads: int, cpus: int) -> int:
    """The decode kernels' threads while a prefill worker runs prompts: decode's less
    prefill's, at least one (0 in either means one per CPU, as their settings do)."""
    return max(1, (decode_threads or cpus) - (prefill_threads or cpus))
