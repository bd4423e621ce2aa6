"""A resolved ClusterConfig back to the dict of a cluster file, for the file a launcher writes for
its children (the keys themselves never in it: they read their key files)."""

from __future__ import annotations

import dataclasses
from typing import Any

from splitserve.config.cluster import ClusterConfig


def config_to_dict(config: ClusterConfig) -> dict[str, Any]:
    """The inverse of config_from_dict, for handing a resolved config to child processes."""
    assert config.addresses is not None
    router = dataclasses.asdict(config.router)
    del router["api_key"]  # never in a file: children read it from api_key_file
    del router["admin_key"]  # nor this one: admin_key_file
    return {
        "model": dataclasses.asdict(config.model),
        "router": router,
        "lifecycle": dataclasses.asdict(config.lifecycle),
        "security": dataclasses.asdict(config.security),
        "cluster": {
            "mode": config.mode,
            "run_dir": config.run_dir,
            "decode_slots": list(config.decode_slots),
            "cpus": {role: list(cs) for role, cs in config.cpus.items()},
        },
        "addresses": {
            "router": config.addresses.router,
            "prefill": list(config.addresses.prefill),
            "decode": list(config.addresses.decode),
            "detok": list(config.addresses.detok),
        },
        "hosts": config.hosts,
    }
