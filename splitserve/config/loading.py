"""A cluster file (TOML) and flags to a ClusterConfig: unknown sections and keys refused, every
value checked (checks.py), addresses defaulted from the run directory when the file names none."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from typing import Any

from splitserve.config.checks import (
    WORKER_ROLES,
    check_addresses,
    check_connection_limits,
    check_detok_worker_mib,
    check_engine_batching,
    check_engine_threads,
    check_prefix_cache,
    check_private,
    check_slots,
    check_stuck_bounds,
    check_transport_security,
    check_weight_format,
    parse_role_cpus,
    router_values,
    router_with_key,
)
from splitserve.config.cluster import ClusterConfig
from splitserve.config.sections import (
    Addresses,
    LifecycleConfig,
    ModelConfig,
    RouterConfig,
    SecurityConfig,
)


def _build(cls, values: dict[str, Any], section: str):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown key(s) in [{section}]: {', '.join(sorted(unknown))}")
    return cls(**values)


def default_addresses(mode: str, run_dir: str, counts: dict[str, int]) -> Addresses:
    """inproc names (threads mode) or ipc sockets in run_dir: `<role>-<index>`."""
    if mode == "threads":
        prefix, suffix = f"inproc://splitserve-{id(run_dir)}-", ""
    else:
        prefix, suffix = f"ipc://{run_dir}/", ".sock"
    names = {
        role: tuple(f"{prefix}{role}-{i}{suffix}" for i in range(counts[role]))
        for role in WORKER_ROLES
    }
    return Addresses(router=f"{prefix}router{suffix}", **names)


def _endpoints(addr: dict[str, Any], role: str) -> tuple[str, ...]:
    value = addr.get(role, ())
    if isinstance(value, str):
        value = [value]
    endpoints = tuple(value) if isinstance(value, list) else ()
    if not endpoints or not all(isinstance(e, str) and e for e in endpoints):
        raise ValueError(f"[addresses] {role} must be an endpoint or a non-empty list of them")
    return endpoints


def load_config(
    path: str | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    fresh_run_dir: Callable[[], str] | None = None,
):
    """Read a TOML cluster file (optional) and apply per-section overrides (from flags).
    fresh_run_dir: a launcher's maker of a run directory, for a file that names none (a role
    process has none: a file without run_dir or [addresses] is an error there)."""
    raw: dict[str, Any] = {}
    if path:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
        if raw.get("router", {}).get("api_key"):
            check_private(path, "a cluster file holding [router] api_key")
        _relative_to(raw, os.path.dirname(os.path.abspath(path)))
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    return config_from_dict(raw, fresh_run_dir)


def _relative_to(raw: dict[str, Any], base: str) -> None:
    """Paths of a cluster file that are relative are relative to the file: its keys and key
    file travel with it, whatever the directory a process starts in."""
    for section, key in (("security", "keys_dir"), ("router", "api_key_file"),
                         ("router", "admin_key_file")):
        table = raw.get(section)
        if isinstance(table, dict) and isinstance(table.get(key), str) and table[key]:
            table[key] = os.path.join(base, table[key])


def config_from_dict(
    raw: dict[str, Any], fresh_run_dir: Callable[[], str] | None = None
) -> ClusterConfig:
    known_sections = {"model", "router", "lifecycle", "cluster", "addresses", "hosts", "security"}
    unknown = set(raw) - known_sections
    if unknown:
        raise ValueError(f"unknown section(s): {', '.join(sorted(unknown))}")
    cluster = dict(raw.get("cluster", {}))
    mode = cluster.pop("mode", "processes")
    if mode not in ("processes", "threads"):
        raise ValueError(f"cluster.mode must be 'processes' or 'threads', not {mode!r}")
    counts = {
        "prefill": int(cluster.pop("prefill_workers", 1)),
        "decode": int(cluster.pop("decode_workers", 1)),
        "detok": int(cluster.pop("detok_workers", 2)),
    }
    decode_slots = tuple(cluster.pop("decode_slots", ()))
    run_dir = cluster.pop("run_dir", "")
    cpus = parse_role_cpus(cluster.pop("cpus", {}), "[cluster.cpus]")
    if cpus and mode == "threads":
        raise ValueError("[cluster.cpus] pins role processes: it needs mode = 'processes'")
    if cluster:
        raise ValueError(f"unknown key(s) in [cluster]: {', '.join(sorted(cluster))}")
    addr = raw.get("addresses")
    if not run_dir and fresh_run_dir is not None:  # a launcher: its children's file lives there
        run_dir = fresh_run_dir()
    if not run_dir and not addr:  # ipc sockets (or inproc names) need a home of their own
        # a process making a directory of its own would never meet the others (every request
        # got 503 under supervisord)
        raise ValueError(
            "the cluster file needs [cluster] run_dir (where the ipc sockets live) or "
            "[addresses]: every process of the stack must find the same sockets"
        )
    if addr:
        addresses = _addresses_from(addr)
    else:
        for role, n in counts.items():
            if n < 1:
                raise ValueError(f"at least one {role} worker is needed")
        addresses = default_addresses(mode, run_dir, counts)
    check_addresses(addresses)
    if decode_slots and (
        len(decode_slots) != len(addresses.decode)
        or not all(type(n) is int and n >= 1 for n in decode_slots)
    ):
        raise ValueError("[cluster] decode_slots must list a slot count >= 1 per decode worker")
    model = _build(ModelConfig, raw.get("model", {}), "model")
    router = router_with_key(_build(RouterConfig, router_values(raw.get("router", {})), "router"))
    security = _build(SecurityConfig, raw.get("security", {}), "security")
    check_transport_security(addresses, security, mode)
    ahead = router.admit_ahead_tokens
    if ahead != "auto" and (not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 0):
        raise ValueError('[router] admit_ahead_tokens must be "auto" or a count >= 0')
    if router.placement not in ("load", "round_robin"):
        raise ValueError('[router] placement must be "load" or "round_robin"')
    if router.max_running < 1 or router.max_queued < 0:
        raise ValueError("[router] needs max_running >= 1 and max_queued >= 0")
    check_connection_limits(router)
    check_detok_worker_mib(router)
    if model.engine not in ("jax", "fake"):
        raise ValueError(f"model.engine must be 'jax' or 'fake', not {model.engine!r}")
    check_prefix_cache(model)
    check_slots(model)
    check_engine_batching(model)
    check_engine_threads(model)
    check_weight_format(model)
    lifecycle = _build(LifecycleConfig, raw.get("lifecycle", {}), "lifecycle")
    check_stuck_bounds(lifecycle)
    return ClusterConfig(
        model=model,
        router=router,
        lifecycle=lifecycle,
        security=security,
        addresses=addresses,
        mode=mode,
        detok_workers=len(addresses.detok),
        run_dir=run_dir,
        decode_slots=decode_slots,
        hosts=dict(raw.get("hosts", {})),
        cpus=cpus,
    )


def _addresses_from(addr: Any) -> Addresses:
    if not isinstance(addr, dict):
        raise ValueError("[addresses] must be a table")
    keys = {"router", "prefill", "decode", "detok"}
    if set(addr) != keys:
        missing, unknown = keys - set(addr), set(addr) - keys
        raise ValueError(
            "[addresses] needs router, prefill, decode and detok"
            + (f"; missing {', '.join(sorted(missing))}" if missing else "")
            + (f"; unknown {', '.join(sorted(unknown))}" if unknown else "")
        )
    if not isinstance(addr["router"], str):
        raise ValueError("[addresses] router must be an endpoint")
    return Addresses(addr["router"], **{role: _endpoints(addr, role) for role in WORKER_ROLES})
