"""The router's Prometheus metrics, in a registry of its own (no process-global state).

Request-level figures are observed here as requests move; worker figures (free slots, detok load,
decode step time and step gap, prefill time) are read from the latest heartbeats at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from router.requests import RequestHandle
from router.workers import WorkerTable
from splitserve.protocol import DecodeLoad, DetokLoad, HistogramSnapshot, PrefillLoad

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
    0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class RouterMetrics:
    def __init__(
        self, workers: WorkerTable, running: Callable[[], int], waiting: Callable[[], int]
    ):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "splitserve_requests",
            "Finished requests by finish reason",
            ["finish_reason"],
            registry=r,
        )
        self.migrations = Counter(
            "splitserve_request_migrations",
            "Requests moved off a worker that died, by the role of that worker",
            ["role"],
            registry=r,
        )
        self.rejected = Counter(
            "splitserve_rejected_requests", "Requests refused at admission", ["reason"], registry=r
        )
        self.prompt_tokens = Counter("splitserve_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter(
            "splitserve_generation_tokens", "Generated tokens", registry=r
        )
        self.ttft = Histogram(
            "splitserve_time_to_first_token_seconds",
            "Time to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "splitserve_inter_token_latency_seconds",
            "Time between a request's token deliveries, per token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "splitserve_e2e_request_latency_seconds",
            "End-to-end request latency",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "splitserve_request_queue_time_seconds",
            "Time waiting for admission",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        running_gauge = Gauge("splitserve_requests_running", "Requests in the pipeline", registry=r)
        running_gauge.set_function(running)
        waiting_gauge = Gauge("splitserve_requests_waiting", "Requests queued", registry=r)
        waiting_gauge.set_function(waiting)
        r.register(_WorkerCollector(workers))

    def admitted(self, handle: RequestHandle) -> None:
        self.prompt_tokens.inc(handle.prompt_tokens)
        self.queue_time.observe(handle.admitted - handle.submitted)

    def delta(
        self, handle: RequestHandle, n_tokens: int, now: float, previous: float | None
    ) -> None:
        if not n_tokens:
            return
        self.generation_tokens.inc(n_tokens)
        if previous is None:
            self.ttft.observe(now - handle.submitted)
        else:
            gap = (now - previous) / n_tokens
            for _ in range(n_tokens):
                self.itl.observe(gap)

    def ended(self, handle: RequestHandle, now: float) -> None:
        assert handle.result is not None
        self.requests.labels(handle.result.finish_reason.api).inc()
        self.e2e.observe(now - handle.submitted)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _WorkerCollector:
    """Figures from the workers' latest heartbeats."""

    def __init__(self, workers: WorkerTable):
        self.workers = workers

    def collect(self):
        up = GaugeMetricFamily(
            "splitserve_worker_up", "1 when the worker is ready", labels=["role", "index"]
        )
        restarts = CounterMetricFamily(
            "splitserve_worker_restarts",
            "Times the router saw a worker come back as a new process",
            labels=["role", "index"],
        )
        for w in self.workers.workers.values():
            up.add_metric([w.role, str(w.index)], 1.0 if w.state == "ready" else 0.0)
            restarts.add_metric([w.role, str(w.index)], float(w.restarts))
        yield up
        yield restarts
        decode_w = self.workers.get("decode", 0)
        decode = decode_w.load if decode_w else None
        decode = decode if isinstance(decode, DecodeLoad) else None
        for name, doc, value in (
            ("splitserve_decode_free_slots", "Free decode slots", "free_slots"),
            ("splitserve_decode_pending_prefixes", "Prefixes waiting", "pending"),
            ("splitserve_decode_slots", "Decode slots (the batch size)", "num_slots"),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], float(getattr(decode, value) if decode else 0))
            yield gauge
        # tokens / (steps x slots) over an interval is how full the decode batch ran
        for name, doc, value in (
            ("splitserve_decode_steps", "Decode steps run", "steps"),
            ("splitserve_decode_tokens", "Tokens produced by decode steps", "tokens_sent"),
        ):
            counter = CounterMetricFamily(name, doc)
            counter.add_metric([], float(getattr(decode, value) if decode else 0))
            yield counter
        prefill_w = self.workers.get("prefill", 0)
        prefill = prefill_w.load if prefill_w else None
        prefill = prefill if isinstance(prefill, PrefillLoad) else None
        for snap, name, doc in (
            (decode and decode.step_time, "splitserve_decode_step_seconds", "Decode step duration"),
            (
                decode and decode.step_gap,
                "splitserve_decode_step_gap_seconds",
                "Start-to-start time between consecutive busy decode steps",
            ),
            (
                prefill and prefill.prefill_time,
                "splitserve_prefill_seconds",
                "Prefill duration (engine.prefill of one prompt, first token sampled)",
            ),
        ):
            if snap:
                yield _histogram(name, doc, snap)
                # exact quantiles over the worker's recent window: finer than the buckets
                recent = GaugeMetricFamily(
                    f"{name}_recent", f"{doc}: quantiles over the recent window",
                    labels=["quantile"],
                )  # fmt: skip
                for q, value in ((0.5, snap.p50), (0.9, snap.p90), (0.99, snap.p99)):
                    recent.add_metric([str(q)], float(value))
                yield recent
        streams = GaugeMetricFamily(
            "splitserve_detok_streams", "Open streams per detok worker", labels=["index"]
        )
        tokens = GaugeMetricFamily(
            "splitserve_detok_tokens", "Tokens detokenized per detok worker", labels=["index"]
        )
        for w in self.workers.workers.values():
            load = w.load
            if isinstance(load, DetokLoad):
                streams.add_metric([str(w.index)], float(load.streams))
                tokens.add_metric([str(w.index)], float(load.tokens))
        yield streams
        yield tokens
        dropped = GaugeMetricFamily(
            "splitserve_dropped_sends",
            "Messages dropped by a worker's non-blocking sends",
            labels=["role", "index"],
        )
        for w in self.workers.workers.values():
            dropped.add_metric([w.role, str(w.index)], float(w.transport.dropped))
        yield dropped


def _histogram(name: str, doc: str, snap: HistogramSnapshot) -> HistogramMetricFamily:
    buckets = []
    cumulative = 0
    for bound, count in zip([*snap.buckets, float("inf")], snap.counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=snap.sum)
