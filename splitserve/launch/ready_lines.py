"""What `splitserve serve` prints while a stack starts: one line per worker as it becomes ready
(read from the router's /health, which names every worker and its state), and, when nothing
else was printed for quiet_s, a line naming who is still starting, so that a cold start (minutes
of compiling on a small machine) never looks hung.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from splitserve.launch.health import Health

QUIET_S = 8.0  # a cold start shows a line at least this often (the workers log more)


class ReadyLines:
    """Call with each /health read (None while the router does not answer yet)."""

    def __init__(
        self,
        out: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        quiet_s: float = QUIET_S,
    ):
        self.out = out
        self.clock = clock
        self.quiet_s = quiet_s
        self.start = self.last_line = clock()
        self.ready: set[tuple[str, int]] = set()

    def __call__(self, health: Health | None) -> None:
        now = self.clock()
        elapsed = now - self.start
        states = health.worker_states() if health is not None else {}
        for (role, index), state in sorted(states.items()):
            if state == "ready" and (role, index) not in self.ready:
                self.ready.add((role, index))
                self.say(f"{role}[{index}] ready after {elapsed:.0f} s", now)
        if now - self.last_line >= self.quiet_s:
            waiting = [f"{r}[{i}] {s}" for (r, i), s in sorted(states.items()) if s != "ready"]
            if health is None:
                who = "the router's HTTP port"
            else:
                who = ", ".join(waiting) or "the router to admit requests"
            self.say(f"still starting after {elapsed:.0f} s: waiting for {who}", now)

    def say(self, line: str, now: float) -> None:
        self.out(f"splitserve: {line}")
        self.last_line = now
