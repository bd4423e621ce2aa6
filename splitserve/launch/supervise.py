"""The supervision loop of a launcher: watch the children, and when one exits either stop
everything or restart it with a back-off; SIGTERM / SIGINT end the loop, and the caller then
stops the stack in order (the router first, which drains running requests).

Two policies:
- StopAll: the first exit ends the loop.
- RestartWithBackoff: a role that exits is started again (`splitserve serve`, deploy/launch.sh's
  hosts: the router moves the requests of a dead worker, so a restart is all it takes), at once
  the first time, then no sooner than a back-off after its previous start that doubles with
  each quick crash (up to max_backoff_s) and resets once it ran stable_s, so a role that
  crashes at start-up does not spin; each restart is counted and logged.
Each round the loop may also call `tick` (e.g. to follow the detok pool's size), and first asks
its `watch` (run_dir_watch.py) whether the run directory is still there: when it is not, the loop
returns what the watch found before it restarts anything (a restart there would fail, or meet
no sockets), and the launcher starts the stack again or exits. A worker that its `stuck` watch
(stuck.py) finds stopped is killed (SIGKILL), and the policy then restarts it as any exit.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from splitserve.launch.run_dir_watch import RunDirWatch
from splitserve.launch.stuck import StuckWatch

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.2
KILL_WAIT_S = 5.0  # a killed stuck worker is reaped within this, or on a later round
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Supervised(Protocol):
    children: dict[tuple[str, int], Any]  # (role, index) -> child: .role, .index, .name, .popen

    def dead(self) -> list[Any]: ...  # children that exited
    def spawn(self, role: str, index: int) -> Any: ...


class StopSignals:
    """SIGTERM / SIGINT recorded, not acted on in the handler: `event` is set and `received`
    names the signal; the loops waiting on `event` return and the launcher drains its stack."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.received: int | None = None

    def install(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.received = signum
        self.event.set()


class StopAll:
    """Any exit ends supervision."""

    def on_exit(self, child: Any, now: float) -> str:
        return "stop"


@dataclass
class RestartWithBackoff:
    """A dead role is restarted, no sooner than its back-off after its previous start."""

    backoff_s: float = 2.0
    max_backoff_s: float = 30.0
    stable_s: float = 60.0  # a run this long resets the back-off
    restarts: Counter[tuple[str, int]] = field(default_factory=Counter)
    last_start: dict[tuple[str, int], float] = field(default_factory=dict)
    quick_crashes: Counter[tuple[str, int]] = field(default_factory=Counter)

    def on_exit(self, child: Any, now: float) -> str:
        """"restart" now, or "wait" (it is checked again on the next round)."""
        key = (child.role, child.index)
        started = self.last_start.get(key)
        if started is not None:
            if now - started < self.backoff(key):
                return "wait"
        self.restarts[key] += 1
        self.last_start[key] = now
        return "restart"

    def backoff(self, key: tuple[str, int]) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** self.quick_crashes[key])

    def started_ran(self, key: tuple[str, int], ran_s: float) -> None:
        """How long the previous run lasted: a short one doubles the next back-off."""
        if ran_s < self.stable_s:
            self.quick_crashes[key] += 1
        else:
            self.quick_crashes[key] = 0


Policy = StopAll | RestartWithBackoff


def supervise(
    stack: Supervised,
    policy: Policy,
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
    interval_s: float = POLL_INTERVAL_S,
    tick: Callable[[], None] | None = None,
    watch: RunDirWatch | None = None,
    stuck: StuckWatch | None = None,
) -> Any | None:
    """Watch `stack` until `stop` is set (None), the policy stops at a child's exit (that
    child), or `watch` finds the run directory lost (its RunDirLost). Restarts are done here,
    each with a log line that counts them."""
    seen_dead: dict[tuple[str, int], float] = {}  # when each dead child was first seen dead
    while not stop.is_set():
        lost = watch.lost() if watch is not None else None
        if lost is not None:
            log.error("%s: the stack cannot go on there", lost.reason)
            return lost
        for child, why in stuck.stuck(list(stack.children.values())) if stuck else []:
            log.error("%s (pid %d) makes no progress: %s: killing it to restart it",
                      child.name, child.popen.pid, why)  # fmt: skip
            child.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # else: reaped next round
                child.popen.wait(timeout=KILL_WAIT_S)
        for child in stack.dead():
            key = (child.role, child.index)
            now = clock()
            if key not in seen_dead and isinstance(policy, RestartWithBackoff):
                started = policy.last_start.get(key)
                if started is not None:  # it was restarted before: did that run last?
                    policy.started_ran(key, now - started)
            seen_dead.setdefault(key, now)
            action = policy.on_exit(child, now)
            if action == "stop":
                return child
            if action == "restart":
                n = policy.restarts[key]
                log.warning("%s exited with status %s: restarting it (restart %d)",
                            child.name, child.popen.returncode, n)  # fmt: skip
                stack.spawn(child.role, child.index)
                seen_dead.pop(key, None)
        if tick is not None:
            tick()
        stop.wait(interval_s)
    return None
