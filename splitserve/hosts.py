"""Which processes each host of a cluster file runs: its [hosts.<name>] tables.

    [hosts.prefill-a]
    roles = ["router", "prefill:0"]      # a role alone: every worker of it; "role:K" one;
    cpus = { prefill = [0], router = [1] }   # "role:J-K" a range (the detok pool: "detok:0-1")

    [hosts.prefill-b]
    roles = ["prefill:1"]

A host named prefill-host or decode-host without a roles key runs what the two-host layout gives
it (router and prefill; decode and the detok pool). deploy/launch.sh (hostlaunch.py) and
`splitserve deploy supervisord --host NAME` both read the plan from here, so the file is the one
source of truth of what runs where. Every index must exist in [addresses], and no process may be
given to two hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from splitserve.config import ROLES, ClusterConfig, parse_role_cpus

DEFAULT_ROLES = {"prefill-host": ["router", "prefill"], "decode-host": ["decode", "detok"]}
_SPEC = re.compile(r"^([a-z]+)(?::(\d+)(?:-(\d+))?)?$")

Instance = tuple[str, int]  # (role, index)


@dataclass(frozen=True)
class HostPlan:
    name: str
    instances: tuple[Instance, ...]  # in the order of ROLES, then by index
    cpus: dict[str, tuple[int, ...]]  # role (or "io") -> the CPUs its processes are pinned to

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(role for role, _ in self.instances))

    def of(self, role: str) -> list[int]:
        """The indices of this host's processes of a role."""
        return [i for r, i in self.instances if r == role]


def parse_role_spec(spec: Any, config: ClusterConfig, where: str) -> list[Instance]:
    """"decode" (every decode worker), "prefill:1", "detok:0-1" -> [(role, index), ...]."""
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if m is None or m.group(1) not in ROLES:
        raise ValueError(f"{where}: {spec!r} is not ROLE, ROLE:K or ROLE:J-K "
                         f"(roles: {', '.join(ROLES)})")  # fmt: skip
    role, count = m.group(1), config.count(m.group(1))
    if m.group(2) is None:
        return [(role, i) for i in range(count)]
    first = int(m.group(2))
    last = int(m.group(3)) if m.group(3) is not None else first
    if not first <= last < count:
        have = f"indices 0-{count - 1}" if count > 1 else "index 0"
        raise ValueError(f"{where}: {spec!r}: the cluster's {role} workers have {have}")
    return [(role, i) for i in range(first, last + 1)]


def host_plan(config: ClusterConfig, host: str) -> HostPlan:
    table: Any = config.hosts.get(host, {})
    where = f"[hosts.{host}]"
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table")
    unknown = set(table) - {"roles", "cpus"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    specs = table.get("roles", DEFAULT_ROLES.get(host, []))
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"host {host!r} has no roles: add {where} roles = [...]")
    found: list[Instance] = []
    for spec in specs:
        for instance in parse_role_spec(spec, config, f"{where} roles"):
            if instance in found:
                raise ValueError(f"{where} roles: {instance[0]}:{instance[1]} is listed twice")
            found.append(instance)
    instances = tuple(sorted(found, key=lambda ri: (ROLES.index(ri[0]), ri[1])))
    cpus = parse_role_cpus(dict(table.get("cpus", {})), f"[hosts.{host}.cpus]")
    return HostPlan(host, instances, cpus)


def host_plans(config: ClusterConfig) -> dict[str, HostPlan]:
    """Every host of the file; ValueError if two hosts are given the same process."""
    plans = {name: host_plan(config, name) for name in config.hosts}
    owner: dict[Instance, str] = {}
    for name, plan in plans.items():
        for instance in plan.instances:
            if instance in owner:
                role, index = instance
                raise ValueError(f"{role}:{index} is given to both [hosts.{owner[instance]}] "
                                 f"and [hosts.{name}]")  # fmt: skip
            owner[instance] = name
    return plans
