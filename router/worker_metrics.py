"""The workers' figures on /metrics, read from their latest heartbeats at scrape time.

Every series is per worker (`role` and `index` labels, or `index` where the name says the role),
so P prefill, D decode and N detok workers each show up; sums and maxima are the dashboard's.
Cumulative counts are counters (`_total`), current levels gauges. vLLM's
`vllm:kv_cache_usage_perc` is here too: the positions the live decode slots hold over what every
decode worker's slots could hold, across the ready decode workers.

A worker's own KV transfer time has no clock shared between processes to measure it by: what is
exported is what each side can measure alone, the bytes the prefill workers sent and the decode
workers received, and the decode worker's insert time (a prefix into its slot).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from router.workers import WorkerState, WorkerTable
from splitserve.protocol import DecodeLoad, DetokLoad, HistogramSnapshot, PrefillLoad

# (name, help, attribute of the load report); counters get `_total` from prometheus_client
PREFILL_GAUGES = (
    ("splitserve_prefill_queue", "Requests waiting for their prefill", "queue"),
    ("splitserve_prefill_queued_tokens", "Prompt tokens of the requests waiting", "queued_tokens"),
    ("splitserve_prefix_cache_blocks", "KV blocks in the prefix cache", "prefix_blocks"),
    ("splitserve_prefix_cache_bytes", "Bytes of the prefix cache's blocks", "prefix_bytes"),
    ("splitserve_prefix_cache_max_bytes", "The prefix cache's byte bound", "prefix_max_bytes"),
    ("splitserve_prefix_cache_check",
     "The prefix cache's invariants: 1 hold, 0 broken, -1 not checked (off or too large)",
     "prefix_check"),
    ("splitserve_prefix_cache_compiling_programs",
     "Prefix-cache continuation programs still compiling in the background (0: all ready)",
     "prefix_compiling"),
)  # fmt: skip
PREFILL_COUNTERS = (
    ("splitserve_prefills", "Prefills run", "prefills"),
    ("splitserve_kv_sent_bytes", "KV cache bytes sent to decode workers", "kv_bytes_sent"),
    ("splitserve_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
     "prefix_queries"),
    ("splitserve_prefix_cache_hits", "Prompt tokens found in the prefix cache", "prefix_hits"),
    ("splitserve_prefix_cache_evicted_blocks", "Blocks evicted from the prefix cache",
     "prefix_evicted"),
    ("splitserve_prefill_batched_calls", "Prefill calls that ran more than one prompt",
     "batched_calls"),
)  # fmt: skip
PREFILL_HISTOGRAMS = (
    ("splitserve_prefill_seconds",
     "Prefill time per prompt (a batched call's time shared among its prompts)", "prefill_time"),
)  # fmt: skip
DECODE_GAUGES = (
    ("splitserve_decode_slots", "Decode slots (the batch size)", "num_slots"),
    ("splitserve_decode_free_slots", "Free decode slots", "free_slots"),
    ("splitserve_decode_pending_prefixes", "Prefixes waiting for a slot", "pending"),
    ("splitserve_decode_kv_tokens", "Positions the live slots hold", "kv_tokens"),
    ("splitserve_decode_kv_capacity_tokens", "Positions every slot could hold", "kv_capacity"),
    ("splitserve_decode_compiling_programs",
     "Multi-step decode programs still compiling in the background (0: all ready)",
     "compiling"),
)
# tokens / (steps x slots) over an interval is how full the decode batch ran
DECODE_COUNTERS = (
    ("splitserve_decode_steps", "Decode steps run", "steps"),
    ("splitserve_decode_chunks", "Decode dispatches of several steps ([model] decode_steps)",
     "chunks"),
    ("splitserve_decode_tokens", "Tokens produced by decode steps", "tokens_sent"),
    ("splitserve_kv_received_bytes", "KV cache bytes received from prefill workers",
     "kv_bytes_received"),
    ("splitserve_decode_failed_inserts", "Prefixes that could not be inserted", "failed_inserts"),
)  # fmt: skip
DECODE_HISTOGRAMS = (
    ("splitserve_decode_step_seconds", "Decode step duration", "step_time"),
    ("splitserve_decode_step_gap_seconds",
     "Start-to-start time between consecutive busy decode steps", "step_gap"),
    ("splitserve_decode_insert_seconds", "A prefix into its decode slot (engine.insert)",
     "insert_time"),
)  # fmt: skip
DETOK_GAUGES = (("splitserve_detok_streams", "Open streams", "streams"),)
DETOK_COUNTERS = (
    ("splitserve_detok_tokens", "Tokens detokenized", "tokens"),
    ("splitserve_detok_resumed_streams", "Streams taken over from another detok worker",
     "resumed"),
)  # fmt: skip
DETOK_HISTOGRAMS = (
    ("splitserve_detok_pass_seconds", "One detok pass over the tokens received", "pass_time"),
)
ROLE_FIGURES = {
    "prefill": (PrefillLoad, PREFILL_GAUGES, PREFILL_COUNTERS, PREFILL_HISTOGRAMS),
    "decode": (DecodeLoad, DECODE_GAUGES, DECODE_COUNTERS, DECODE_HISTOGRAMS),
    "detok": (DetokLoad, DETOK_GAUGES, DETOK_COUNTERS, DETOK_HISTOGRAMS),
}


class WorkerCollector:
    """ids: the (model_name, engine) label values of the vLLM series."""

    def __init__(self, workers: WorkerTable, ids: tuple[str, str]):
        self.workers = workers
        self.ids = ids

    def collect(self) -> Iterator[Metric]:
        workers = list(self.workers.workers.values())
        yield from liveness(workers)
        for role, figures in ROLE_FIGURES.items():
            yield from role_figures([w for w in workers if w.role == role], *figures)
        yield self.kv_cache_usage([w for w in workers if w.role == "decode"])
        yield from self.prefix_cache([w for w in workers if w.role == "prefill"])

    def prefix_cache(self, prefills: list[WorkerState]) -> Iterator[Metric]:
        """vllm:prefix_cache_queries and vllm:prefix_cache_hits: counters, in prompt tokens,
        summed over the prefill workers that keep a cache (a worker's restart starts its own
        counts again, as vLLM's do). With no cache anywhere nothing is exported, rather than
        zeros that would read as a cache that never hits."""
        loads = [w.load for w in prefills
                 if isinstance(w.load, PrefillLoad) and w.load.prefix_max_bytes]  # fmt: skip
        if not loads:
            return
        for name, doc, attr in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in prompt tokens",
             "prefix_queries"),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in prompt tokens", "prefix_hits"),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=["model_name", "engine"])
            family.add_metric(list(self.ids), float(sum(getattr(x, attr) for x in loads)))
            yield family

    def kv_cache_usage(self, decodes: list[WorkerState]) -> Metric:
        held = capacity = 0
        for w in decodes:
            if w.state == "ready" and isinstance(w.load, DecodeLoad):
                held += w.load.kv_tokens
                capacity += w.load.kv_capacity
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage across the decode workers; 1 means 100 percent usage",
            labels=["model_name", "engine"],
        )
        usage.add_metric(list(self.ids), held / capacity if capacity else 0.0)
        return usage


def liveness(workers: list[WorkerState]) -> Iterator[Metric]:
    """Per worker: ready or not, how long since its last heartbeat, how long its loop has been
    in one pass, draining, restarts, and its transport's dropped and malformed messages."""
    labels = ["role", "index"]
    up = GaugeMetricFamily("splitserve_worker_up", "1 when the worker is ready", labels=labels)
    age = GaugeMetricFamily(
        "splitserve_worker_heartbeat_age_seconds", "Since the worker's last heartbeat",
        labels=labels,
    )  # fmt: skip
    loop = GaugeMetricFamily(
        "splitserve_worker_loop_age_seconds",
        "Since the worker's loop last completed a pass, as of its last heartbeat",
        labels=labels,
    )
    draining = GaugeMetricFamily(
        "splitserve_worker_draining", "1 while the worker drains (stopping)", labels=labels
    )
    restarts = CounterMetricFamily(
        "splitserve_worker_restarts", "Times the router saw the worker restart", labels=labels
    )
    dropped = CounterMetricFamily(
        "splitserve_dropped_sends",
        "Messages dropped by the worker's non-blocking sends (a slow or gone peer)",
        labels=labels,
    )
    malformed = CounterMetricFamily(
        "splitserve_malformed_messages", "Messages the worker refused as malformed", labels=labels
    )
    now = time.monotonic()
    for w in workers:
        key = [w.role, str(w.index)]
        up.add_metric(key, 1.0 if w.state == "ready" else 0.0)
        restarts.add_metric(key, float(w.restarts))
        if w.last_seen:
            age.add_metric(key, now - w.last_seen)
        beat = w.heartbeat
        if beat is not None:
            loop.add_metric(key, float(beat.loop_age_s))
            draining.add_metric(key, 1.0 if beat.draining else 0.0)
            dropped.add_metric(key, float(beat.transport.dropped))
            malformed.add_metric(key, float(beat.transport.malformed))
    yield from (up, age, loop, draining, restarts, dropped, malformed)


def role_figures(workers, load_type, gauges, counters, histograms) -> Iterator[Metric]:
    """One role's load figures, per worker index; workers without a report yet are left out."""
    loads = [(str(w.index), w.load) for w in workers if isinstance(w.load, load_type)]
    for family_type, table in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
        for name, doc, attr in table:
            family = family_type(name, doc, labels=["index"])
            for index, load in loads:
                family.add_metric([index], float(getattr(load, attr)))
            yield family
    for name, doc, attr in histograms:
        yield from histogram_families(name, doc, [(i, getattr(load, attr)) for i, load in loads])


def histogram_families(
    name: str, doc: str, snaps: list[tuple[str, HistogramSnapshot]]
) -> Iterator[Metric]:
    """The bucketed histogram per index, and beside it exact p50/p90/p99 over each worker's recent
    window as `<name>_recent{quantile}`: finer than the buckets."""
    hist = HistogramMetricFamily(name, doc, labels=["index"])
    recent = GaugeMetricFamily(
        f"{name}_recent", f"{doc}: quantiles over the recent window", labels=["index", "quantile"]
    )
    for index, snap in snaps:
        buckets = []
        cumulative = 0
        for bound, count in zip([*snap.buckets, float("inf")], snap.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        hist.add_metric([index], buckets, snap.sum)
        for q, value in ((0.5, snap.p50), (0.9, snap.p90), (0.99, snap.p99)):
            recent.add_metric([index, str(q)], float(value))
    yield hist
    yield recent
