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
One idea per module:
- sections.py: a frozen dataclass per section of the file ([model], [router], [lifecycle],
  [security]) and the ZeroMQ endpoints of [addresses].
- cluster.py: ClusterConfig, the whole configuration every role receives.
- checks.py: the checks of values beyond their types, applied once as a file is loaded.
- loading.py: a cluster file and flags to a checked ClusterConfig (load_config, config_from_dict).
- writing.py: a ClusterConfig back to the file a launcher hands its children (config_to_dict).
"""

from splitserve.config.checks import ROLES, WORKER_ROLES, check_private, parse_role_cpus
from splitserve.config.cluster import ClusterConfig
from splitserve.config.loading import config_from_dict, default_addresses, load_config
from splitserve.config.sections import (
    Addresses,
    LifecycleConfig,
    ModelConfig,
    RouterConfig,
    SecurityConfig,
)
from splitserve.config.writing import config_to_dict
from splitserve.endpoints import bind_address

# `splitserve.config` is the import for all of these; also kept importable from here: the
# receivers' bind_address (splitserve/transport.py), the roles, and the checks other loaders
# share (splitserve/cli.py, splitserve/hosts.py)
__all__ = [
    "ROLES", "WORKER_ROLES", "Addresses", "ClusterConfig", "LifecycleConfig", "ModelConfig",
    "RouterConfig", "SecurityConfig", "bind_address", "check_private", "config_from_dict",
    "config_to_dict", "default_addresses", "load_config", "parse_role_cpus",
]  # fmt: skip
