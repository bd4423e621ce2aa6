"""The supervision loop of a launcher: watch the children, and when one exits either stop
everything or restart it with a back-off; SIGTERM / SIGINT end the loop, and the caller then
stops the stack in order (the router first, which drains running requests).

Two policies:
- StopAll: the first exit ends the loop (`splitserve serve` today: a local stack without one of
  its roles is broken, and the user sees it at once).
- RestartWithBackoff: a role that exits is started again, at once the first time, then no
  sooner than backoff_s after its previous start, so a role that crashes at start-up does not
  spin; each restart is counted and logged (deploy/launch.sh's hosts).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Supervised(Protocol):
    def dead(self) -> list[Any]: ...  # children that exited: .role, .index, .name, .popen
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
    """A dead role is restarted, no sooner than backoff_s after its previous start."""

    backoff_s: float = 2.0
    restarts: Counter[tuple[str, int]] = field(default_factory=Counter)
    last_start: dict[tuple[str, int], float] = field(default_factory=dict)

    def on_exit(self, child: Any, now: float) -> str:
        """"restart" now, or "wait" (it is checked again on the next round)."""
        key = (child.role, child.index)
        if now < self.last_start.get(key, -float("inf")) + self.backoff_s:
            return "wait"
        self.restarts[key] += 1
        self.last_start[key] = now
        return "restart"


Policy = StopAll | RestartWithBackoff


def supervise(
    stack: Supervised,
    policy: Policy,
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
    interval_s: float = POLL_INTERVAL_S,
) -> Any | None:
    """Watch `stack` until `stop` is set (None) or the policy stops at a child's exit (that
    child). Restarts are done here, each with a log line that counts them."""
    while not stop.is_set():
        for child in stack.dead():
            action = policy.on_exit(child, clock())
            if action == "stop":
                return child
            if action == "restart":
                n = policy.restarts[(child.role, child.index)]
                log.warning("%s exited with status %s: restarting it (restart %d)",
                            child.name, child.popen.returncode, n)  # fmt: skip
                stack.spawn(child.role, child.index)
        stop.wait(interval_s)
    return None
