"""ClusterConfig: the whole configuration, built once at start-up (loading.py) and handed to
every role; what the roles ask of it (counts, slots, endpoints) as methods."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from splitserve.config.checks import WORKER_ROLES
from splitserve.config.sections import (
    Addresses,
    LifecycleConfig,
    ModelConfig,
    RouterConfig,
    SecurityConfig,
)


@dataclass(frozen=True)
class ClusterConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    addresses: Addresses | None = None
    mode: str = "processes"
    detok_workers: int = 2
    run_dir: str = ""
    decode_slots: tuple[int, ...] = ()  # per decode worker; empty: model.num_slots each
    hosts: dict[str, Any] = field(default_factory=dict)  # deploy/launch.sh: host -> roles, cpus
    # `splitserve serve` (processes mode): role -> the CPUs its processes are pinned to; "io":
    # where the workers' ZeroMQ I/O threads run (e.g. off the decode worker's own CPU)
    cpus: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def detok_count(self) -> int:
        return len(self.addresses.detok) if self.addresses else self.detok_workers

    def count(self, role: str) -> int:
        """How many workers of a role the cluster has (the router: one)."""
        if role == "router":
            return 1
        assert self.addresses is not None
        return len(self.addresses.of(role))

    def slots_of(self, decode_index: int) -> int:
        """Decode slots (the batch size) of one decode worker as configured; 0 for "auto",
        which the worker settles from its model (the router uses what its Ready reports)."""
        if self.decode_slots:
            return self.decode_slots[decode_index]
        return self.model.num_slots if isinstance(self.model.num_slots, int) else 0

    def endpoint_of(self, role: str, index: int) -> str:
        """Where worker (role, index) listens. An index past the configured list (a detok worker
        added while serving) follows the list's own pattern for ipc and inproc endpoints
        (`.../detok-<index>.sock`); tcp endpoints must be listed."""
        assert self.addresses is not None
        listed = self.addresses.of(role)
        if 0 <= index < len(listed):
            return listed[index]
        match = re.fullmatch(rf"((?:ipc|inproc)://.*{role}-)\d+(\.sock)?", listed[-1])
        if index < 0 or match is None:
            raise ValueError(f"no endpoint for {role} worker {index}: add it to [addresses] {role}")
        return f"{match.group(1)}{index}{match.group(2) or ''}"

    def process_at(self, endpoint: str) -> tuple[str, int] | None:
        """The process (role, index) whose receiver is at endpoint, None if none is."""
        assert self.addresses is not None
        if endpoint == self.addresses.router:
            return ("router", 0)
        for role in WORKER_ROLES:
            for index, listed in enumerate(self.addresses.of(role)):
                if listed == endpoint:
                    return (role, index)
        return None

    @property
    def most_slots(self) -> int:
        """The most decode slots the cluster can have: "auto" settles at most max_running."""
        most = self.router.max_running
        return sum(self.slots_of(d) or most for d in range(self.count("decode")))
