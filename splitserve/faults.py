"""Fault injection for tests: messages between workers delayed, swapped in pairs, or lost.

Inert unless the environment variable SPLITSERVE_FAULTS is set, e.g.
SPLITSERVE_FAULTS="prefill_to_detok_delay=0.3,decode_to_detok_reorder=1,prefill_to_decode_drop=1".
Each key is a path name and a fault: <path>_delay (seconds every message is held), <path>_reorder
(consecutive messages go out in swapped pairs), <path>_drop (every message is lost, as in a crash
between two sends). The paths the workers name are prefill_to_detok, prefill_to_decode,
decode_to_detok, detok_to_decode and <role>_to_router (heartbeats, on a socket of their own, are
never faulted).

Two bounds make a full queue easy to reach: prefill_to_decode_hwm (the messages the prefill
worker's socket to each decode worker queues, instead of message_limits.prefix_send_hwm) and
prefill_to_decode_outbox_bytes (the bytes of prefixes it holds for one decode worker whose
socket takes no more, instead of message_limits.PREFIX_OUTBOX_BYTES); see FaultInjector.bound.

The worker shell wraps each of its senders with FaultInjector.wrap() and calls release_due() once
per loop pass; with no faults configured, wrap() returns the sender itself and release_due() has
nothing to do, so production sends never pass through this module.
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from splitserve import protocol
from splitserve.transport import Sender

log = logging.getLogger(__name__)

ENV_VAR = "SPLITSERVE_FAULTS"
SWAP_WAIT_S = 0.05  # a message held for a swap partner that does not come goes out after this


def parse_faults(spec: str) -> dict[str, float]:
    """"prefill_to_detok_delay=0.3,decode_to_detok_reorder=1" -> {name: value}; a bare name is 1."""
    faults: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition("=")
        faults[key.strip()] = float(value or 1)
    return faults


@dataclass(order=True)
class _Held:
    due: float
    order: int
    frames: list[Any] = field(compare=False)


class FaultySender:
    """A Sender whose messages are held for delay_s, or swapped in pairs, before they go out.

    Nothing leaves until release_due() is called; the FaultInjector that made it does so.
    """

    def __init__(self, inner: Sender, delay_s: float = 0.0, reorder: bool = False):
        self.inner = inner
        self.delay_s = delay_s
        self.reorder = reorder
        self.endpoint = inner.endpoint
        self._held: list[_Held] = []
        self._order = 0
        self._swap: list[Any] | None = None
        self._swap_since = 0.0

    def send(self, msg: Any, arrays: list | None = None) -> bool:
        return self.send_frames(protocol.encode(msg, arrays))

    def offer(self, frames: list[Any]) -> bool:
        return self.send_frames(frames)  # held here: the socket's room is not this one's

    def send_frames(self, frames: list[Any]) -> bool:
        # memoryviews may point into buffers the caller reuses: hold bytes copies
        frames = [bytes(f) for f in frames]
        if not self.reorder:
            self._hold(frames)
        elif self._swap is None:
            self._swap, self._swap_since = frames, time.monotonic()
        else:  # the later message goes out first
            first, self._swap = self._swap, None
            self._hold(frames)
            self._hold(first)
        return True

    def _hold(self, frames: list[Any]) -> None:
        self._order += 1
        heapq.heappush(self._held, _Held(time.monotonic() + self.delay_s, self._order, frames))

    def release_due(self) -> None:
        """Send what is due now (and a swap candidate whose partner did not come)."""
        now = time.monotonic()
        if self._swap is not None and now - self._swap_since > SWAP_WAIT_S:
            self._hold(self._swap)
            self._swap = None
        while self._held and self._held[0].due <= now:
            self.inner.send_frames(heapq.heappop(self._held).frames)

    def close(self) -> None:
        self.inner.close()


class DroppingSender:
    """A Sender that loses every message, as a crash between two sends would."""

    def __init__(self, inner: Sender):
        self.inner = inner
        self.endpoint = inner.endpoint

    def send(self, msg: Any, arrays: list | None = None) -> bool:
        return True

    def send_frames(self, frames: list[Any]) -> bool:
        return True

    def offer(self, frames: list[Any]) -> bool:
        return True

    def close(self) -> None:
        self.inner.close()


AnySender = Sender | FaultySender | DroppingSender


class FaultInjector:
    """The faults one worker applies, and the held senders it releases once per loop pass."""

    def __init__(self, faults: dict[str, float]):
        self.faults = faults
        self._held: list[FaultySender] = []

    @classmethod
    def from_env(cls, environ: dict[str, str]) -> FaultInjector:
        return cls(parse_faults(environ.get(ENV_VAR, "")))

    def wrap(self, sender: Sender, path: str) -> AnySender:
        """The sender for path, with the faults configured for it (itself when there are none)."""
        if not self.faults:
            return sender
        if self.faults.get(f"{path}_drop"):
            log.warning("fault injection on %s: every message dropped", path)
            return DroppingSender(sender)
        delay = self.faults.get(f"{path}_delay", 0.0)
        reorder = bool(self.faults.get(f"{path}_reorder", 0.0))
        if not (delay or reorder):
            return sender
        log.warning("fault injection on %s: delay %.3fs reorder %s", path, delay, reorder)
        faulty = FaultySender(sender, delay_s=delay, reorder=reorder)
        self._held.append(faulty)
        return faulty

    def bound(self, name: str, default: int) -> int:
        """A queue bound the environment sets (e.g. prefill_to_decode_hwm=1), else default."""
        return int(self.faults.get(name, default))

    def release_due(self) -> None:
        """Send every held message that is due; called by the worker shell once per loop pass."""
        for sender in self._held:
            sender.release_due()
