"""A launcher's check, each supervision pass, that its run directory is still its own.

A tmp cleaner that deletes a serving stack's run directory (it lives under /tmp) takes the ipc
sockets' names, the children's cluster file and the API key file with it. The processes keep
serving on the sockets they hold, so nothing shows until one of them exits: its restart then
failed on the missing cluster file, over and over, and after a decode worker died the stack
answered 503 for good while its launcher ran on. A stack in that state cannot be mended one
process at a time: a restarted worker, given its file back, would still find no router socket
to connect to, since only a restart of the router binds one again. So the launcher, told by
this watch, stops the whole stack (the router first, which drains) and starts it again in a
run directory of its own (the same path when the cluster file names one, recreated; a fresh
one otherwise); where it cannot (the cluster file went too, or the path is now another's),
it exits non-zero saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RunDirLost:
    """What supervise() returns when its watch finds the run directory gone."""

    reason: str


class RunDirWatch:
    """The run directory, the launcher's lock in it (its descriptor: a directory made again in
    the old one's place, empty, holds another file or none, while the held one is unlinked) and
    the files the launcher wrote there."""

    def __init__(self, path: str, lock_fd: int, files: Iterable[str]):
        self.path = path
        self.lock_fd = lock_fd
        self.files = list(files)

    def lost(self) -> RunDirLost | None:
        """Why the stack cannot go on in its run directory, or None."""
        if not os.path.isdir(self.path):
            return RunDirLost(f"run dir {self.path} is gone")
        if os.fstat(self.lock_fd).st_nlink == 0:
            return RunDirLost(f"run dir {self.path} was deleted and made again")
        for path in self.files:
            if not os.path.exists(path):
                return RunDirLost(f"{path} is gone")
        return None
