"""Configuration: frozen dataclasses built once at start-up from a TOML cluster file and flags.

Nothing reads configuration from module globals later; every role receives its ClusterConfig.

A cluster file (all sections optional):

    [model]
    engine = "jax"              # or "fake" (hand-checkable arithmetic, no model)
    path = "default"            # .gguf file, Hugging Face folder, "random:<preset>", or "default"
    tokenizer = ""              # defaults to the model path (GGUF vocab or HF folder)
    chat_template = ""          # a Jinja file that replaces the model's own chat template
    num_slots = "auto"          # decode slots (the batch size): auto sizes them from kv_cache_mib
    kv_cache_mib = 2048         # with num_slots auto: every slot's KV cache at max_seq_len fits
    max_seq_len = 2048
    prefill_batch_tokens = 256  # prompt tokens the prefill worker runs in one batched call
    decode_steps = 4            # decode steps per dispatch while nothing waits (1: one a call)
    decode_steps_max_live = 0   # ... and while at most this many slots are live (0: any)
    cpu_threads = 0             # the decode engine's XLA threads (0: one per CPU)
    prefill_cpu_threads = "auto"  # the prefill engine's (0: one per CPU; auto: half the CPUs)
    share_cores = true          # decode's kernels leave prefill its cores while it runs prompts
    weight_format = "auto"      # decode's matrices: auto, float32, bfloat16, int8 or gguf
    prefill_weight_format = "float32"  # prefill's: float32, bfloat16-xla, bfloat16-native, auto
    huge_pages = true           # move the engines' weights onto 2 MiB pages (Linux 6.1+)

    [cluster]
    mode = "processes"          # or "threads"
    prefill_workers = 1
    decode_workers = 1
    detok_workers = 2
    decode_slots = []           # slots per decode worker (default: model.num_slots each)
    run_dir = ""                # where ipc sockets live (created 0700); needed by a role started
                                # on its own (supervisord) without [addresses]: a launcher
                                # (`splitserve serve`) makes a fresh one when empty

    [router]
    host = "127.0.0.1"
    port = 8000
    max_running = 64
    admin_key_file = ""         # the admin endpoints' own key (0600; or SPLITSERVE_ADMIN_KEY)
    detok_worker_mib = 0        # MiB a new detok worker is counted at (0: measured)
    header_timeout_s = 10.0     # client connections: see RouterConfig
    max_connections = 4096
    trust_request_chat_template = false  # true: a request may bring its own chat template

    [addresses]                 # ZeroMQ endpoints each receiver binds (exactly: see
                                # splitserve/endpoints.py) and its senders connect to
    router = "tcp://10.0.0.1:5550"
    prefill = ["tcp://10.0.0.1:5551"]               # one per prefill worker (a string: one)
    decode = ["tcp://10.0.0.2:5552", "tcp://10.0.0.3:5552"]
    detok = ["tcp://10.0.0.2:5560", "tcp://10.0.0.2:5561"]

    [security]
    keys_dir = "/etc/splitserve/keys"  # CURVE keys (`splitserve keys generate`): every tcp endpoint
                                # is then encrypted and each peer authenticated; tcp on an address
                                # other than loopback is refused without them

    [lifecycle]
    heartbeat_interval_s = 0.25
    liveness_timeout_s = 1.5    # the router: no heartbeat for this long, the worker is dead
    drain_timeout_s = 10.0      # SIGTERM: running requests may finish up to this long
    stuck_timeout_s = 30.0      # the launcher: a worker whose heartbeat thread has not run this
                                # long (stopped) is killed and restarted (splitserve/progress.py)
    loop_stuck_timeout_s = 600.0  # ... or whose loop has not completed a pass this long (0: never)

The worker counts come from the address lists when [addresses] is given. The API key is never
written in a cluster file handed to children: `api_key_file` (0600) or SPLITSERVE_API_KEY.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from splitserve.config_checks import (
    ROLES,
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
from splitserve.endpoints import bind_address

# kept importable from here: the receivers' bind_address (splitserve/transport.py), the roles,
# and the checks other loaders share (splitserve/cli.py, splitserve/hosts.py)
__all__ = ["ROLES", "WORKER_ROLES", "bind_address", "check_private", "parse_role_cpus"]



@dataclass(frozen=True)
class ModelConfig:
    engine: str = "jax"
    path: str = "default"
    tokenizer: str = ""
    # a Jinja file whose template replaces the model's own (GGUF metadata, chat_template.jinja,
    # tokenizer_config.json); read by the router at start-up (splitserve/tokenizers/chat_sources.py)
    chat_template: str = ""
    # decode slots of each decode worker (the most requests its batch runs at once): "auto" is
    # the largest power of two whose KV caches, every one at max_seq_len positions, fit in
    # kv_cache_mib, at most [router] max_running (engine/slot_count.py): 16 for the default
    # model, 64 for a small one. The decode worker settles it from the model when it loads it,
    # and reports it in Ready; the router places and admits by the reported count.
    num_slots: int | str = "auto"
    kv_cache_mib: float = 2048  # MiB; a fraction for a small bound (tests of few slots)
    max_seq_len: int = 2048
    compile_cache_dir: str = os.path.join(os.path.expanduser("~"), ".cache", "splitserve", "jax")
    # XLA intra-op threads of the decode engine's process (0: one per CPU).
    cpu_threads: int = 0
    # the form of the decode step's matrices (engine/quant.py): "auto" is a GGUF file's own
    # Q8_0/Q4_0/Q4_1 blocks through the native kernel (exact), float32 for other checkpoints;
    # "int8" (ggml's Q8_0 rounding) or "bfloat16" round a float32 checkpoint for the kernel,
    # "float32" runs XLA's matmuls. Measured per batch size in docs/benchmarks.md ("Weight
    # formats").
    weight_format: str = "auto"
    # the form of the prefill side's matrices (a prompt's many rows favour XLA's matmuls over
    # the decode side's kernel): "float32" (exact: the default), "bfloat16-xla" (each layer's
    # weights and activations rounded to bfloat16, float32 sums, the head kept float32 because
    # its one row per prompt misses the matrix units: a burst of prompts 2.6x as fast where the
    # CPU has bfloat16 matrix units, Intel AMX, but 3 of 20 greedy answers of the default model
    # changed), "bfloat16-native" (the same numbers from the native kernel, the weights packed
    # for it once: on the AMX tiles 3x float32's speed, with AVX512-BF16's dot products where
    # there are no tiles 1.7x; XLA's products where the CPU has neither), "auto" the third
    # where the CPU has either, else the first (engine.prefill_weight_format;
    # docs/benchmarks.md, "Prefill in bfloat16", "Prefill on the tiles", "Prefill in bfloat16
    # without tiles").
    prefill_weight_format: str = "float32"
    # XLA intra-op threads of the prefill engine's process (0: one per CPU; "auto": half the
    # CPUs, at least one). Under load prefill and decode share the cores; measured on 2 cores
    # (docs/benchmarks.md, "How the two cores are shared"), one prefill thread served 1.06x
    # the tokens/s at 16 streams and 1.07x at 64, with shorter times to first token, and 0.95x
    # at one stream (its prompt prefills on one core: TTFT 0.47 against 0.34 s). A likely
    # reason: XLA splits a product into one share per thread, so a share whose thread decode
    # preempts holds up the whole product, where the decode kernels hand out small chunks.
    prefill_cpu_threads: int | str = "auto"
    # Cores shared between the prefill and decode workers of one host (splitserve/core_share.py):
    # while a prefill worker of the same run_dir runs prompts, the decode engine's kernels take
    # the cores prefill leaves (cpu_threads less prefill_cpu_threads, at least one), and all of
    # them otherwise. On 2 cores at 16 streams the decode team had lost a core to prefill and
    # waited for it (docs/benchmarks.md, "Decode steps aside while a prompt runs").
    share_cores: bool = True
    # The prefill worker runs the plain prompts waiting at the front of its queue in one call,
    # up to this many prompt tokens (0: one prompt a call); the engine compiles a (count,
    # length) program per bucket within it. Prefill on a CPU is compute-bound: batching pays
    # where a call's fixed cost (reading the weights, dispatch) dominates, i.e. short prompts
    # (measured: docs/benchmarks.md, "Batched prefill and steps per dispatch").
    prefill_batch_tokens: int = 256
    # decode steps per dispatch while no prefix waits and no live slot has logits controls or a
    # grammar: the host's per-step work is paid once per k steps. A stop string or an abort
    # waits for the chunk in flight (at most decode_steps steps); warm-up compiles the decode
    # programs once per k (kept in the executable store after).
    decode_steps: int = 4
    # ... only while at most this many slots are live (0: however many). A k-step dispatch pays
    # where the host's work per dispatch is a large part of a step: a small model's at every
    # batch size, the default model's at one or two live rows only (docs/benchmarks.md), where
    # each k-step program costs a cold start about 6 s of compiling. Warm-up compiles the
    # k-step programs only for the batch buckets up to this count.
    decode_steps_max_live: int = 0
    # the engines' weights moved onto 2 MiB pages once placed (engine/huge_pages.py): a decode
    # step streams them all, and fewer page translations make that faster; off, they stay on
    # the pages the allocator gave them
    huge_pages: bool = True
    # prefix reuse (prefill_worker/prefix_cache.py): the prefill worker keeps KV blocks of
    # prefix_block_tokens tokens, up to prefix_cache_mb, and a prompt computes only what its
    # longest cached block run does not cover
    prefix_cache: bool = True
    prefix_cache_mb: float = 256  # MiB; a fraction for a small bound (tests of eviction)
    prefix_block_tokens: int = 16
    # the JAX engine's prefill length buckets (empty: powers of two from 16, then max_seq_len,
    # for batches, continuations and inserts, and finer lengths for a lone prompt's pass:
    # buckets.prompt_lengths); named ones serve every use. With the prefix cache on, each pair
    # of them is a continuation program to compile, so a deployment with known prompt lengths
    # may name fewer
    prefill_buckets: tuple[int, ...] = ()
    # fake engine only: seconds each decode step and each prefill take (simulated compute)
    fake_step_s: float = 0.0
    fake_prefill_s: float = 0.0


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_running: int = 64  # requests admitted into the pipeline at once
    # A request is admitted into the pipeline when a decode slot is free for it, or when its
    # prefill would be done about when one frees (router/admission.py). This is the
    # decode steps one prefill takes: too small leaves slots idle while prefills catch up, too
    # large and a new stream pauses after its first token until its slot frees. "auto": measured
    # from the workers' own figures; 0: only for free slots.
    admit_ahead_tokens: int | str = "auto"
    max_queued: int = 256  # admitted-later requests waiting at the router; beyond that: overload
    # A queued request waits while the pipeline moves (router/admission.py): it is refused only
    # when no request progressed for queue_timeout_s, after request_timeout_s in all, or at once
    # when the measured service rate says the queue ahead would take longer than that.
    queue_timeout_s: float = 30.0
    request_timeout_s: float = 600.0  # hard bound on any request's life
    stall_timeout_s: float = 30.0  # no progress for this long ends a request with an error
    # a request whose worker dies is moved to live ones (router/migration.py), at most this
    # many times, and waits at most migration_timeout_s for a live worker to take it
    max_migrations: int = 3
    migration_timeout_s: float = 120.0
    # how the router picks prefill and decode workers (router/placement.py): "load" (fewest
    # prompt tokens queued; most free slots), or "round_robin" (a baseline for benchmarks)
    placement: str = "load"
    # with several prefill workers and the prefix cache on, "load" counts the tokens a worker
    # likely has cached as work it need not do (router/prefix_affinity.py); false: load alone
    # (the baseline splitserve/bench/prefix.py measures it against)
    prefix_affinity: bool = True
    api_key: str = ""  # the key itself, read from api_key_file (never written to a child's file)
    api_key_file: str = ""  # a file holding the key, readable by its owner only (0600)
    # /metrics without the API key (as vLLM serves it), for scrapers; /health is always open
    open_metrics: bool = False
    # The operator's admin endpoints (router/http/admin.py) take a key of their own, never the
    # clients' API key (which is refused there): from admin_key_file (0600) or
    # SPLITSERVE_ADMIN_KEY, never written in a child's file. Without one they are refused.
    admin_key: str = ""
    admin_key_file: str = ""
    # What each detok worker the admin endpoint adds is counted at (MiB) against the memory
    # this host has available; a pool the host cannot hold is refused (router/detok_memory.py).
    # 0: the largest resident set of the running detok workers of this host, else an estimate.
    detok_worker_mib: float = 0
    # the names the model answers to, the first in responses and metrics (as vLLM's
    # --served-model-name); empty: a short name from the model path (splitserve/model_names.py)
    served_model_name: tuple[str, ...] = ()
    # Client connections (router/http/connections.py). A request's headers must be complete within
    # header_timeout_s of the connection opening (or of its previous response), and its body may
    # not stall for body_timeout_s. At most max_connections at once, max_connections_per_peer from
    # one client address; at either limit the connection that has waited longest without a whole
    # request is closed to make room, so idle or trickling connections cannot lock others out.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096
    max_connections_per_peer: int = 256
    # a request's own chat template (vLLM's chat_template field) is a program its client wrote:
    # refused (400) unless true (vLLM's --trust-request-chat-template); when true it runs in the
    # router's contained children under a time limit (router/http/chat_templates.py)
    trust_request_chat_template: bool = False


@dataclass(frozen=True)
class Addresses:
    """ZeroMQ endpoints: each role's receiver binds its own, senders connect to it."""

    router: str
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    detok: tuple[str, ...]

    def of(self, role: str) -> tuple[str, ...]:
        """The endpoints of a worker role's workers, by index."""
        return {"prefill": self.prefill, "decode": self.decode, "detok": self.detok}[role]


@dataclass(frozen=True)
class LifecycleConfig:
    heartbeat_interval_s: float = 0.25
    liveness_timeout_s: float = 1.5  # no heartbeat for this long: the worker is dead
    drain_timeout_s: float = 10.0  # SIGTERM: running requests may finish up to this long
    state_ttl_s: float = 30.0  # tombstones and orphan tokens are forgotten after this
    # A worker that stops making progress is killed (SIGKILL) by its launcher and restarted, its
    # requests moving as a dead worker's do (splitserve/progress.py: each worker process's
    # record in the run directory). Stopped: its heartbeat thread, which runs on through a long
    # prefill or compile, has not run for stuck_timeout_s. Stuck: its loop has not completed a
    # pass for loop_stuck_timeout_s (one engine call may take minutes on a small machine, so
    # this bound is long). 0: not judged.
    stuck_timeout_s: float = 30.0
    loop_stuck_timeout_s: float = 600.0


@dataclass(frozen=True)
class SecurityConfig:
    # a directory of CURVE keys (splitserve/security.py): `<name>.key` public, `<name>.key_secret`
    # secret (0600), one pair per process (`router`, `prefill-0`, `decode-1`, `detok-0`, ...)
    keys_dir: str = ""


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
