"""Readiness over the router's /health, waited for with a deadline.

GET /health answers 200 once a full pipeline is ready (the router admits requests) and 503
before, both with the state of every worker the router knows. What counts as ready depends on
who waits: `splitserve serve` wants the 200, tests also want every detok worker on the ring, and
a host of a cluster wants its own workers ready whatever the other host's state.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from splitserve.config import ClusterConfig

POLL_INTERVAL_S = 0.1


@dataclass(frozen=True)
class Health:
    status: int  # 200: a full pipeline is ready; 503: not (yet), or draining
    body: dict[str, Any]

    def worker_states(self) -> dict[tuple[str, int], str]:
        return {(w["role"], w["index"]): w["state"] for w in self.body.get("workers", [])}


Readiness = Callable[[Health], bool]


def pipeline_ready(health: Health) -> bool:
    """The router admits requests: every role has a ready worker."""
    return health.status == 200


def every_worker_ready(health: Health) -> bool:
    """A full pipeline, and every worker the router knows is ready (all detok workers too)."""
    return health.status == 200 and all(s == "ready" for s in health.worker_states().values())


def workers_ready(expected: Iterable[tuple[str, int]]) -> Readiness:
    """These workers are ready, whatever the others' state (a 503 body counts too)."""
    wanted = set(expected)
    return lambda health: all(health.worker_states().get(k) == "ready" for k in wanted)


def read_health(url: str, timeout_s: float = 2.0) -> Health | None:
    """GET url (a /health URL); None when nothing answers, or not in JSON."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return Health(resp.status, json.loads(resp.read()))
    except urllib.error.HTTPError as err:  # 503 while not ready
        try:
            return Health(err.code, json.loads(err.read() or b"{}"))
        except ValueError:
            return None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def health_url(config: ClusterConfig) -> str:
    """Where the router's /health is reached from this host."""
    host = config.router.host
    if host in ("0.0.0.0", "::", ""):  # it listens everywhere: reach it where it lives
        host = "127.0.0.1"
        router = config.addresses.router if config.addresses else ""
        if router.startswith("tcp://"):
            named = router.split("://", 1)[1].rsplit(":", 1)[0]
            host = named if named not in ("*", "0.0.0.0") else host
    return f"http://{host}:{config.router.port}/health"


class StackNotReady(RuntimeError):
    """A stack did not become ready: a role exited first, or the deadline passed."""

    def __init__(self, message: str, exited: list[str]):
        super().__init__(message)
        self.exited = exited


class Watched(Protocol):
    def dead(self) -> list[Any]: ...  # children that exited (each with a .name)


def wait_ready(
    url: str,
    timeout_s: float,
    ready: Readiness = pipeline_ready,
    stack: Watched | None = None,
    stop: threading.Event | None = None,
    observe: Callable[[Health | None], None] | None = None,
) -> bool:
    """Poll `url` until `ready`: True. False when `stop` is set first (a signal: the caller
    stops). StackNotReady when a child of `stack` exits first, or after timeout_s. `observe`
    sees every read (None: nothing answered), e.g. to print workers as they become ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        if stop is not None and stop.is_set():
            return False
        dead = [c.name for c in stack.dead()] if stack is not None else []
        if dead:
            raise StackNotReady(f"{', '.join(dead)} exited before the stack was ready", dead)
        health = read_health(url)
        if observe is not None:
            observe(health)
        if health is not None and ready(health):
            return True
        if time.monotonic() >= deadline:
            raise StackNotReady(f"{url} not ready within {timeout_s:.0f} s", [])
        if stop is not None:
            stop.wait(POLL_INTERVAL_S)
        else:
            time.sleep(POLL_INTERVAL_S)
