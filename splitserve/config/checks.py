"""The checks of a cluster file's values beyond their types, applied once as it is loaded
(loading.py): endpoints well-formed and each receiver's own, tcp beyond loopback only
with CURVE keys, secrets readable by their owner alone, connection limits that leave room,
CPU lists, served model names."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from splitserve.config.sections import (
    Addresses,
    LifecycleConfig,
    ModelConfig,
    RouterConfig,
    SecurityConfig,
)
from splitserve.endpoints import is_loopback, parse_endpoint
from splitserve.secret_files import read_secret_file

ROLES = ("router", "prefill", "decode", "detok")
WORKER_ROLES = ("prefill", "decode", "detok")


def check_private(path: str, what: str) -> None:
    """A file holding a secret must be readable by its owner alone (as ssh asks of its keys)."""
    if os.stat(path).st_mode & 0o077:
        raise ValueError(f"{path}: {what} must be readable by its owner only: chmod 600 it")


def router_with_key(router: RouterConfig) -> RouterConfig:
    """[router] with its API key and admin key read from api_key_file and admin_key_file when
    they are named (and checked private); the two keys must differ."""
    for field in ("api_key", "admin_key"):
        path = getattr(router, f"{field}_file")
        if path:
            check_private(path, f"{field}_file")
            key = read_secret_file(path)
            if not key:
                raise ValueError(f"[router] {field}_file {path} is empty")
            router = dataclasses.replace(router, **{field: key})
    return check_admin_key(router)


def check_admin_key(router: RouterConfig) -> RouterConfig:
    """The admin key is the operator's: a client holding the API key must not hold it too."""
    if router.admin_key and router.admin_key == router.api_key:
        raise ValueError("the admin key must differ from the API key (clients hold that one)")
    return router


def check_detok_worker_mib(router: RouterConfig) -> None:
    mib = router.detok_worker_mib
    if isinstance(mib, bool) or not isinstance(mib, int | float) or mib < 0:
        raise ValueError("[router] detok_worker_mib must be a size in MiB >= 0 (0: measured)")


def check_transport_security(
    addresses: Addresses, security: SecurityConfig, mode: str
) -> None:
    """Safe by default: a tcp endpoint reachable from the network needs CURVE keys. Without them
    any process that reaches a worker's port could end its streams or rewrite a client's answer.
    Loopback tcp is allowed without keys (one host: only local processes reach it), ipc sockets
    are guarded by their file permissions (0600 in a 0700 run_dir), inproc never leaves the
    process."""
    if security.keys_dir:
        if mode == "threads":
            raise ValueError("[security] keys_dir is for processes mode: threads mode's inproc "
                             "sockets never leave the process")  # fmt: skip
        return  # each process reads its own keys when it makes its sockets (security.Keyring)
    for role in ROLES:
        endpoints = [addresses.router] if role == "router" else addresses.of(role)
        for endpoint in endpoints:
            parsed = parse_endpoint(endpoint)
            if parsed.transport == "tcp" and not is_loopback(parsed.address):
                raise ValueError(
                    f"[addresses] {role}: {endpoint} is reachable from the network, and without "
                    "CURVE keys anyone who reaches it can forge messages: make keys with "
                    "`splitserve keys generate DIR --config FILE` and set [security] keys_dir, "
                    "or use a loopback or ipc endpoint"
                )


def router_values(values: dict[str, Any]) -> dict[str, Any]:
    """[router] as RouterConfig takes it: served_model_name, a name or a list, as a tuple."""
    values = dict(values)
    names = values.get("served_model_name", ())
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) and n for n in names):
        raise ValueError("[router] served_model_name must be a name or a list of names")
    if "served_model_name" in values:
        values["served_model_name"] = tuple(names)
    for flag in ("open_metrics", "trust_request_chat_template"):
        if not isinstance(values.get(flag, False), bool):
            raise ValueError(f"[router] {flag} must be true or false")
    return values


def parse_role_cpus(raw: Any, where: str) -> dict[str, tuple[int, ...]]:
    """{role: [cpu, ...]} checked: known roles, non-empty lists of CPU numbers."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a table of role = [cpu, ...]")
    out: dict[str, tuple[int, ...]] = {}
    for role, cpus in raw.items():
        if role not in (*ROLES, "io"):
            raise ValueError(f"{where}: unknown role {role!r} (roles: {', '.join(ROLES)}, io)")
        if (
            not isinstance(cpus, list | tuple)
            or not cpus
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cpus)
        ):
            raise ValueError(f"{where}.{role} must be a non-empty list of CPU numbers")
        out[role] = tuple(cpus)
    return out


def check_connection_limits(router: RouterConfig) -> None:
    for name in ("header_timeout_s", "body_timeout_s"):
        value = getattr(router, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
            raise ValueError(f"[router] {name} must be a number of seconds above 0")
    for name in ("max_connections", "max_connections_per_peer"):
        value = getattr(router, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"[router] {name} must be a count of at least 1")
    if router.max_connections_per_peer > router.max_connections:
        raise ValueError("[router] max_connections_per_peer cannot exceed max_connections")
    if router.max_connections <= router.max_running + router.max_queued:
        # each running or queued request holds its connection: room must be left for new ones
        raise ValueError("[router] max_connections must exceed max_running + max_queued")


def check_addresses(addresses: Addresses) -> None:
    """Every endpoint well-formed (splitserve/endpoints.py), and each receiver's its own."""
    named = [("[addresses] router", addresses.router)]
    for role in WORKER_ROLES:
        named += [(f"[addresses] {role}[{k}]", e) for k, e in enumerate(addresses.of(role))]
    for where, endpoint in named:
        parse_endpoint(endpoint, where)
    seen: dict[str, str] = {}
    for where, endpoint in named:
        if endpoint in seen:
            raise ValueError(f"{where} and {seen[endpoint]} are both {endpoint!r}: each receiver"
                             " needs an endpoint of its own")  # fmt: skip
        seen[endpoint] = where


# decode slots a worker may be configured with: a batch this large is far past where a step on
# a CPU stops gaining from more rows; the cap keeps a typo from allocating a cache for it
MAX_SLOTS = 4096
MAX_DECODE_STEPS = 32  # a stop string or an abort waits for the chunk in flight: keep it short


def check_slots(model: ModelConfig) -> None:
    """The decode slot count and the KV budget "auto" sizes it from, at load: a bad one would
    only show as a decode worker that fails to start."""
    slots = model.num_slots
    if slots != "auto" and (type(slots) is not int or not 1 <= slots <= MAX_SLOTS):
        raise ValueError(f'[model] num_slots must be "auto" or a count of slots, 1 to {MAX_SLOTS}')
    budget = model.kv_cache_mib
    if type(budget) not in (int, float) or not 0 < budget <= 1 << 30:
        raise ValueError("[model] kv_cache_mib must be a size in MiB above 0")


def check_engine_batching(model: ModelConfig) -> None:
    """The workers' batching keys, at load: a bad one would only show as a failed warm-up."""
    budget, steps = model.prefill_batch_tokens, model.decode_steps
    if type(budget) is not int or not 0 <= budget <= 1 << 20:
        raise ValueError("[model] prefill_batch_tokens must be a count of tokens, 0 to 1048576")
    if type(steps) is not int or not 1 <= steps <= MAX_DECODE_STEPS:
        raise ValueError(f"[model] decode_steps must be a count of steps, 1 to {MAX_DECODE_STEPS}")
    live = model.decode_steps_max_live
    if type(live) is not int or not 0 <= live <= 1 << 16:  # 0 or above num_slots: every batch
        raise ValueError("[model] decode_steps_max_live must be a count of live slots (0: any)")
    if not isinstance(model.huge_pages, bool):
        raise ValueError("[model] huge_pages must be true or false")


def check_engine_threads(model: ModelConfig) -> None:
    """The engines' XLA thread counts, at load: a bad one would only show as a worker that
    fails to start (or silently runs on every CPU)."""

    def is_count(threads: Any) -> bool:
        return type(threads) is int and 0 <= threads <= 4096

    if not is_count(model.cpu_threads):
        raise ValueError("[model] cpu_threads must be a count of threads (0: one per CPU)")
    if model.prefill_cpu_threads != "auto" and not is_count(model.prefill_cpu_threads):
        raise ValueError('[model] prefill_cpu_threads must be "auto" or a count of threads '
                         "(0: one per CPU)")  # fmt: skip
    if not isinstance(model.share_cores, bool):
        raise ValueError("[model] share_cores must be true or false")


# engine/kernels/quant.py's WEIGHT_FORMATS and "auto" (not imported: the engine's modules
# import jax)
WEIGHT_FORMATS = ("auto", "float32", "bfloat16", "int8", "gguf")


# the prefill side's: "auto", float32 (XLA's products, exact), XLA's bfloat16 products or the
# kernel's
PREFILL_WEIGHT_FORMATS = ("auto", "float32", "bfloat16-xla", "bfloat16-native")
# the names a prefill weight format had before: a cluster file that still says one is told the
# new name rather than only the list
RENAMED_PREFILL_WEIGHT_FORMATS = {"bfloat16-amx": "bfloat16-native"}


def check_weight_format(model: ModelConfig) -> None:
    """Each side's weight form, at load: a bad one would only show as a failed worker."""
    if model.weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"[model] weight_format must be one of {', '.join(WEIGHT_FORMATS)}")
    renamed = RENAMED_PREFILL_WEIGHT_FORMATS.get(model.prefill_weight_format)
    if renamed:
        raise ValueError(f'[model] prefill_weight_format "{model.prefill_weight_format}" is now '
                         f'"{renamed}" (the same products, on AMX tiles or AVX512-BF16)')
    if model.prefill_weight_format not in PREFILL_WEIGHT_FORMATS:
        raise ValueError("[model] prefill_weight_format must be one of "
                         f"{', '.join(PREFILL_WEIGHT_FORMATS)}")  # fmt: skip


def check_prefix_cache(model: ModelConfig) -> None:
    """The prefix cache's keys, at load: a prefill worker would otherwise fail (or keep nothing)
    only once traffic comes."""
    if not isinstance(model.prefix_cache, bool):
        raise ValueError("[model] prefix_cache must be true or false")
    mb, block = model.prefix_cache_mb, model.prefix_block_tokens
    if isinstance(mb, bool) or not isinstance(mb, int | float) or not 0 <= mb <= 1 << 20:
        raise ValueError("[model] prefix_cache_mb must be a size in MiB, 0 to 1048576")
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= 4096:
        raise ValueError("[model] prefix_block_tokens must be a count of tokens, 1 to 4096")
    if model.prefix_cache and block >= model.max_seq_len:
        raise ValueError("[model] prefix_block_tokens must be below max_seq_len")
    buckets = model.prefill_buckets
    if buckets and (
        not all(type(b) is int for b in buckets)
        or list(buckets) != sorted(set(buckets))
        or buckets[0] < 1
        or buckets[-1] != model.max_seq_len
    ):
        raise ValueError("[model] prefill_buckets must ascend from >= 1 and end at max_seq_len")


def check_stuck_bounds(lifecycle: LifecycleConfig) -> None:
    """[lifecycle] stuck_timeout_s and loop_stuck_timeout_s: 0 (not judged), or a bound longer
    than a heartbeat interval (a worker beats once per interval when all is well)."""
    for name in ("stuck_timeout_s", "loop_stuck_timeout_s"):
        value = getattr(lifecycle, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or (
            value != 0 and value <= lifecycle.heartbeat_interval_s
        ):
            interval = lifecycle.heartbeat_interval_s
            raise ValueError(f"[lifecycle] {name} must be 0 (never) or more than "
                             f"heartbeat_interval_s ({interval} s)")  # fmt: skip
