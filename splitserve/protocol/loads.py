"""The load reports the workers' heartbeats carry (messages.Heartbeat): one typed report per role,
the latency histograms inside them, and the transport counters every worker sends. The router
reads them for placement, admission and its metrics (router/workers.py, router/worker_metrics.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HistogramSnapshot:
    """A worker's latency histogram: fixed buckets (seconds) the router can add up, plus exact
    quantiles over the worker's recent window."""

    buckets: list[float]
    counts: list[int]  # one per bucket, then +Inf
    sum: float
    count: int
    p50: float
    p90: float
    p99: float


@dataclass
class TransportCounters:
    """A worker's message counts: sends dropped by a slow or gone peer, frames malformed."""

    sent: int = 0
    dropped: int = 0
    received: int = 0
    malformed: int = 0


@dataclass
class PrefillLoad:
    """Inside a prefill worker's Heartbeat."""

    queue: int  # requests waiting for their prefill
    queued_tokens: int  # their prompt tokens
    prefills: int  # run since start
    kv_bytes_sent: int  # KV cache bytes sent to decode workers since start
    prefill_time: HistogramSnapshot
    # the prefix cache (prefill_worker/prefix_reuse.py): prompt tokens looked up and found
    # cached since start (vLLM's prefix_cache_queries and _hits), blocks and bytes held, the
    # byte bound, and its invariants: 1 hold, 0 broken, -1 not checked (off, or too large)
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefix_blocks: int = 0
    prefix_bytes: int = 0
    prefix_max_bytes: int = 0
    prefix_evicted: int = 0  # blocks evicted since start
    prefix_check: int = -1
    # the seq of the last GenerateRequest or Fence received (0: none yet); with queue == 0, every
    # request sent up to it is done here (the snapshot is taken between loop passes, never
    # during a prefill)
    last_seq: int = 0
    # prefix-cache continuation programs still compiling in the background after Ready (0: all
    # ready); a first start after a build change spends minutes of CPU on them
    prefix_compiling: int = 0
    batched_calls: int = 0  # engine calls that ran more than one prompt, since start
    # prefixes waiting in the outbox for each decode worker (by index) whose socket took no more
    # (prefill_worker/outbox.py), and how many had to wait there since start
    outbox: list[int] = field(default_factory=list)
    outbox_waited: int = 0


@dataclass
class DecodeLoad:
    """Inside a decode worker's Heartbeat."""

    num_slots: int
    free_slots: int
    live: int
    pending: int  # prefixes waiting for a slot
    steps: int
    batches_sent: int
    tokens_sent: int
    tombstones: int
    failed_inserts: int
    kv_tokens: int  # positions the live slots hold (prompt and output so far)
    kv_capacity: int  # positions every slot could hold: num_slots x max_seq_len
    kv_bytes_received: int  # KV cache bytes received from prefill workers since start
    step_time: HistogramSnapshot
    step_gap: HistogramSnapshot  # start-to-start time of consecutive busy steps
    insert_time: HistogramSnapshot  # a prefix into its slot (engine.insert)
    chunks: int = 0  # dispatches of several steps ([model] decode_steps), since start
    # k-step decode programs still compiling in the background after Ready (0: all ready;
    # until then those dispatches run single steps)
    compiling: int = 0


@dataclass
class DetokLoad:
    """Inside a detok worker's Heartbeat."""

    streams: int
    early: int  # streams whose tokens came before their opening
    tombstones: int
    tokens: int
    batches_in: int
    batches_out: int
    broken_streams: int
    resumed: int  # streams taken over from another detok worker (or restarted) since start
    pass_time: HistogramSnapshot
