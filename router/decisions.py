"""What the router core's collaborators decide, as small typed values that the core acts on.

The liveness monitor (router/liveness.py), the migrator (router/migration.py) and the dispatch of
the workers' messages (router/dispatch.py) change nothing outside their own state and the handles
they judge: each returns a list of these, and RouterCore.act carries them out in order. So every
end goes through RouterCore.end (once per request), every send through the router's sockets,
and "a worker died" reads as the chain it is: a Lost, whose moves the migrator returns, each a
Forget of the old placement and the Sends (a Prefill) of the new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.placement import Stamp
from router.requests import RequestHandle
from router.workers import WorkerState
from splitserve.config import WORKER_ROLES
from splitserve.protocol import FinishReason, GenerateRequest


@dataclass(frozen=True, slots=True)
class End:
    """End this request (RouterCore.end: a request that has ended already stays as it ended)."""

    handle: RequestHandle
    reason: FinishReason
    error: str = ""


@dataclass(frozen=True, slots=True)
class Lost:
    """This worker died or restarted: every request that depended on it moves."""

    worker: WorkerState


@dataclass(frozen=True, slots=True)
class WorkersChanged:
    """A worker's state may have changed (`ready`: it just said Ready): placement, admission, the
    detok pool and the moves that wait for a live worker follow."""

    ready: WorkerState | None = None


@dataclass(frozen=True, slots=True)
class Progressed:
    """Requests advanced (their tokens came): admission may let the next waiters in."""


@dataclass(frozen=True, slots=True)
class Send:
    """Send `message` to worker (role, index) now."""

    role: str
    index: int
    message: Any


@dataclass(frozen=True, slots=True)
class Prefill:
    """Send the request to prefill worker `index` again, under the next send sequence number,
    which its handle keeps (router/liveness.py: the first-token bound)."""

    handle: RequestHandle
    index: int
    message: GenerateRequest


@dataclass(frozen=True, slots=True)
class Forget:
    """Tell the request's workers of these roles to forget it at the stamp's epoch and before
    (batched per event-loop turn: router/links.py)."""

    request_id: str
    stamp: Stamp
    roles: tuple[str, ...] = WORKER_ROLES


@dataclass(frozen=True, slots=True)
class Fence:
    """A Fence to prefill worker `index` (router/links.py)."""

    index: int


@dataclass(frozen=True, slots=True)
class Moved:
    """A request moved off a worker of this role (a metric)."""

    role: str


Decision = End | Lost | WorkersChanged | Progressed | Send | Prefill | Forget | Fence | Moved
PROGRESSED = Progressed()
