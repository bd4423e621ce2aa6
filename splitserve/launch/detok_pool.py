"""`splitserve serve`'s side of the elastic detok pool.

The router owns the pool's target size (POST /admin/detok-workers, behind the admin key). Once
a second the launcher reads it (GET /admin/detok-workers, with the admin key), starts the detok
workers missing below it (a new worker joins the ring when it says Ready), and stops those at or
past it once the router reports no streams left on them (the router moved them; SIGTERM then
lets the worker drain and exit, and it is not restarted).

It starts at most STARTING_AT_ONCE at a time: a worker more only once one of those it started
is ready (each loads a tokenizer; a pool grown by hundreds at once had every one of them start
together on a host the router had checked only for their memory, not for a burst of starts).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 1.0
STARTING_AT_ONCE = 4  # detok workers started and not yet ready, at most


class DetokPoolFollower:
    def __init__(
        self,
        stack: Any,  # ProcessStack: children, spawn(), retire()
        admin_url: str,
        admin_key: str,
        interval_s: float = FOLLOW_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stack = stack
        self.admin_url = admin_url
        self.admin_key = admin_key
        self.interval_s = interval_s
        self.clock = clock
        self._next = 0.0

    def __call__(self) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval_s
        pool = self.read_pool()
        if pool is not None:
            self.follow(pool)

    def read_pool(self) -> dict[str, Any] | None:
        request = urllib.request.Request(
            self.admin_url, headers={"Authorization": f"Bearer {self.admin_key}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None  # the router is starting or stopping: try again next round

    def follow(self, pool: dict[str, Any]) -> None:
        target = int(pool["target"])
        running = {index for role, index in self.stack.children if role == "detok"}
        ready = {w["index"] for w in pool["workers"] if w["state"] == "ready"}
        starting = len(running - ready)
        for index in range(target):
            if index not in running:
                if starting >= STARTING_AT_ONCE:  # the rest once some of these are ready
                    break
                log.info("detok pool grows to %d: starting detok[%d]", target, index)
                self.stack.spawn("detok", index)
                starting += 1
        for worker in pool["workers"]:
            index = worker["index"]
            if index >= target and index in running and worker["streams"] == 0:
                log.info("detok pool shrinks to %d: stopping detok[%d]", target, index)
                self.stack.retire("detok", index)
