"""The roles a stack runs and the module each one runs as; the config file handed to children."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable

from splitserve import tomlwrite
from splitserve.config import ClusterConfig, config_to_dict

ROLE_MODULES = {
    "router": "router",
    "prefill": "prefill_worker",
    "decode": "decode_worker",
    "detok": "detok_worker",
}
WORKER_ROLES = ("prefill", "decode", "detok")
ALL_ROLES = (*WORKER_ROLES, "router")
# threads mode: one process runs the router and, as threads, every worker role
THREADS_MODULE = "splitserve.launch.threads_main"


def stack_roles(config: ClusterConfig) -> tuple[str, ...]:
    """The processes of a whole local stack: one per role, or in threads mode the router's
    process alone (it runs every role)."""
    return ("router",) if config.mode == "threads" else ALL_ROLES


def role_module(role: str, mode: str) -> str:
    """What `python -m` runs for a role's process."""
    return THREADS_MODULE if mode == "threads" and role == "router" else ROLE_MODULES[role]


def role_instances(config: ClusterConfig, roles: Iterable[str]) -> list[tuple[str, int]]:
    out = []
    for role in roles:
        count = config.count(role)
        out.extend((role, i) for i in range(count))
    return out


def write_config(config: ClusterConfig, path: str | None = None) -> str:
    """The resolved config as a TOML file (addresses included) for the children to read."""
    path = path or os.path.join(
        config.run_dir or tempfile.mkdtemp(prefix="splitserve-"), "cluster.toml"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(tomlwrite.dumps(config_to_dict(config)))
    return path
