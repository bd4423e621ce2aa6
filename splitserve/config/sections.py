"""The sections of a cluster file, one frozen dataclass each ([model], [router], [lifecycle],
[security]), and the ZeroMQ endpoints of [addresses]. Defaults are the product's; each field's
comment says what it governs and why its default is what it is."""

from __future__ import annotations

import os
from dataclasses import dataclass


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
    # the form of the decode step's matrices (engine/kernels/quant.py): "auto" is a GGUF file's own
    # Q8_0/Q4_0/Q4_1 blocks through the native kernel (exact), float32 for other checkpoints;
    # "int8" (ggml's Q8_0 rounding) or "bfloat16" round a float32 checkpoint for the kernel,
    # "float32" runs XLA's matmuls (each measured by batch size: lab/benchmarks.md, "Weight
    # formats").
    weight_format: str = "auto"
    # the form of the prefill side's matrices (a prompt's many rows favour XLA's matmuls over
    # the decode side's kernel): "float32" (exact, the default: rounding to bfloat16 changes
    # some greedy answers of the default model), "bfloat16-xla" (each layer's weights and
    # activations rounded to bfloat16, float32 sums, the head kept float32 because its one row
    # per prompt misses the matrix units; faster where the CPU has bfloat16 matrix units, Intel
    # AMX), "bfloat16-native" (the same numbers from the native kernel, the weights packed for
    # it once, on the AMX tiles or with AVX512-BF16's dot products where there are no tiles;
    # XLA's products where the CPU has neither), "auto" the third where the CPU has either, else
    # the first (engine.prefill_weight_format). Measured in lab/benchmarks.md, "Prefill in
    # bfloat16", "Prefill on the tiles" and "Prefill in bfloat16 without tiles".
    prefill_weight_format: str = "float32"
    # XLA intra-op threads of the prefill engine's process (0: one per CPU; "auto": half the
    # CPUs, at least one). Under load prefill and decode share the cores: fewer prefill threads
    # served more tokens/s under load, with shorter times to first token, at some cost at one
    # stream, whose lone prompt then runs on fewer cores (lab/benchmarks.md, "How the two cores
    # are shared"). A likely reason: XLA splits a product into one share per thread, so a share
    # whose thread decode preempts holds up the whole product, where the decode kernels hand out
    # small chunks.
    prefill_cpu_threads: int | str = "auto"
    # Cores shared between the prefill and decode workers of one host (splitserve/core_share.py):
    # while a prefill worker of the same run_dir runs prompts, the decode engine's kernels take
    # the cores prefill leaves (cpu_threads less prefill_cpu_threads, at least one), and all of
    # them otherwise: the kernels run each layer as a team of threads, and a member that loses
    # its core to prefill holds the whole team up (lab/benchmarks.md, "Decode steps aside while
    # a prompt runs").
    share_cores: bool = True
    # The prefill worker runs the plain prompts waiting at the front of its queue in one call,
    # up to this many prompt tokens (0: one prompt a call); the engine compiles a (count,
    # length) program per bucket within it. Prefill on a CPU is compute-bound: batching pays
    # where a call's fixed cost (reading the weights, dispatch) dominates, i.e. short prompts
    # (measured: lab/benchmarks.md, "Batched prefill and steps per dispatch").
    prefill_batch_tokens: int = 256
    # decode steps per dispatch while no prefix waits and no live slot has logits controls or a
    # grammar: the host's per-step work is paid once per k steps. A stop string or an abort
    # waits for the chunk in flight (at most decode_steps steps); warm-up compiles the decode
    # programs once per k (kept in the executable store after).
    decode_steps: int = 4
    # ... only while at most this many slots are live (0: however many). A k-step dispatch pays
    # where the host's work per dispatch is a large part of a step: a small model's at every
    # batch size, the default model's at one or two live rows only (lab/benchmarks.md,
    # "Batched prefill and steps per dispatch"), and each k-step program adds to a cold start's
    # compiling. Warm-up compiles the k-step programs only for the batch buckets up to this
    # count.
    decode_steps_max_live: int = 0
    # the engines' weights moved onto 2 MiB pages once placed (engine/kernels/huge_pages.py): a
    # decode step streams them all, and fewer page translations make that faster; off, they
    # stay on the pages the allocator gave them
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
    # (the baseline lab/serving/prefix.py measures it against)
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
