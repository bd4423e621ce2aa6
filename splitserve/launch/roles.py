"""The roles a stack runs and the module each one runs as; the config file handed to children."""

from __future__ import annotations

import os
from collections.abc import Iterable

from splitserve import tomlwrite
from splitserve.config import ClusterConfig, config_to_dict
from splitserve.run_dirs import ensure_private_dir
from splitserve.secret_files import write_secret_file

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
    """The resolved config as a TOML file (addresses included) for the children to read, in the
    run directory (0700) unless path names another place. The API key is never in it: it goes
    to `api_key` beside it (0600), which the file names as [router] api_key_file; the admin
    key likewise to `admin_key` ([router] admin_key_file)."""
    written = write_config_files(config, path)
    return written[0]


def write_config_files(config: ClusterConfig, path: str | None = None) -> list[str]:
    """write_config, returning every file written: the config, then the keys' if any."""
    if path is None:
        if not config.run_dir:
            raise ValueError("no run directory for the children's cluster file")
        path = os.path.join(ensure_private_dir(config.run_dir), "cluster.toml")
    raw = config_to_dict(config)
    written = [path]
    for field in ("api_key", "admin_key"):
        key = getattr(config.router, field)
        if key:
            key_path = os.path.join(os.path.dirname(os.path.abspath(path)), field)
            written.append(write_secret_file(key_path, key + "\n"))
            raw["router"][f"{field}_file"] = key_path
    # 0600 as well: it names where the key and the sockets are
    write_secret_file(path, tomlwrite.dumps(raw))
    return written
