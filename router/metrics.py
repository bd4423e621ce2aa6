"""The router's Prometheus metrics, in a registry of its own (no process-global state).

Two families, so that tools written for vLLM read this server as they read vLLM:
- `vllm:*`: the request-level series under vLLM's names, types and labels (`model_name`, the
  first served name, and `engine`, "0": vLLM's engine index; this server has one pipeline).
  They are observed here as requests move: admitted, first token, every later delta, end.
  prefill time = admitted to first token, decode time = first token to end (vLLM's phases).
- `splitserve_*`: what only a disaggregated server has: refusals by reason, requests moved off
  dead workers, and (router/worker_metrics.py) every worker's liveness and load from its
  heartbeats, read at scrape time.

The `vllm:` names are listed in VLLM_SERIES, which the tests and the Grafana dashboard's test
read. Prefix-cache queries and hits (`vllm:prefix_cache_queries`, `vllm:prefix_cache_hits`,
counters of prompt tokens) come from the prefill workers' PrefillLoad: WorkerCollector.prefix_cache
(router/worker_metrics.py) exports their sum.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from router.admission import AdmissionController
from router.requests import RequestHandle
from router.worker_metrics import WorkerCollector
from router.workers import WorkerTable
from splitserve.config import ClusterConfig
from splitserve.model_names import served_names
from splitserve.protocol import FinishReason

# Seconds. Finer than vLLM's at the low end (a decode step of a small model takes milliseconds),
# and as long as vLLM's at the top (a cold request may wait minutes).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
    0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip

# name -> (Prometheus type, labels beyond model_name and engine)
VLLM_SERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "vllm:num_requests_running": ("gauge", ()),
    "vllm:num_requests_waiting": ("gauge", ()),
    "vllm:kv_cache_usage_perc": ("gauge", ()),
    "vllm:prompt_tokens": ("counter", ()),
    "vllm:generation_tokens": ("counter", ()),
    "vllm:request_success": ("counter", ("finished_reason",)),
    "vllm:request_prompt_tokens": ("histogram", ()),
    "vllm:request_generation_tokens": ("histogram", ()),
    "vllm:request_params_max_tokens": ("histogram", ()),
    "vllm:request_max_num_generation_tokens": ("histogram", ()),
    "vllm:request_time_per_output_token_seconds": ("histogram", ()),
    "vllm:num_preemptions": ("counter", ()),
    "vllm:time_to_first_token_seconds": ("histogram", ()),
    "vllm:inter_token_latency_seconds": ("histogram", ()),
    "vllm:e2e_request_latency_seconds": ("histogram", ()),
    "vllm:request_queue_time_seconds": ("histogram", ()),
    "vllm:request_inference_time_seconds": ("histogram", ()),
    "vllm:request_prefill_time_seconds": ("histogram", ()),
    "vllm:request_decode_time_seconds": ("histogram", ()),
    "vllm:prefix_cache_queries": ("counter", ()),  # from the prefill workers' heartbeats
    "vllm:prefix_cache_hits": ("counter", ()),
}
LABELS = ("model_name", "engine")
# why admission refused a request (router/admission.py, router/core.py)
REJECT_REASONS = ("queue_full", "queue_timeout", "queue_too_slow", "not_ready")
ENGINE = "0"


def token_buckets(max_model_len: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len: vLLM's buckets for token counts."""
    out, base = [], 1
    while True:
        for m in (1, 2, 5):
            if m * base > max_model_len:
                return out
            out.append(m * base)
        base *= 10


class RouterMetrics:
    def __init__(
        self,
        config: ClusterConfig,
        workers: WorkerTable,
        admission: AdmissionController,
    ):
        self.registry = r = CollectorRegistry()
        self.model_name = served_names(config)[0]
        ids = (self.model_name, ENGINE)
        tokens = token_buckets(config.model.max_seq_len)

        def histogram(name: str, doc: str, buckets=LATENCY_BUCKETS) -> Histogram:
            return Histogram(name, doc, LABELS, registry=r, buckets=buckets).labels(*ids)

        for name, doc, fn in (
            ("vllm:num_requests_running", "Requests in the pipeline (admitted)",
             lambda: admission.running),
            ("vllm:num_requests_waiting", "Requests queued for admission",
             lambda: len(admission.waiters)),
        ):  # fmt: skip
            Gauge(name, doc, LABELS, registry=r).labels(*ids).set_function(fn)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of admitted requests", LABELS, registry=r
        ).labels(*ids)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens", LABELS, registry=r
        ).labels(*ids)
        success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason (stop, length, abort, error)",
            [*LABELS, "finished_reason"],
            registry=r,
        )
        self.finished = {
            reason: success.labels(*ids, reason.api)
            for reason in FinishReason
            if reason != FinishReason.NONE
        }
        self.prompt_hist = histogram("vllm:request_prompt_tokens", "Prompt tokens", tokens)
        self.generation_hist = histogram(
            "vllm:request_generation_tokens", "Generated tokens per request", tokens
        )
        self.max_tokens_hist = histogram(
            "vllm:request_params_max_tokens", "The max_tokens of requests", tokens
        )
        self.max_generation_hist = histogram(
            "vllm:request_max_num_generation_tokens",
            "The most tokens a request may generate (max_tokens: one sequence per request)",
            tokens,
        )
        # vLLM counts requests evicted and recomputed; a request here keeps its decode slot
        # until it ends, so this stays 0 (requests moved off a dead worker are
        # splitserve_request_migrations_total)
        Counter("vllm:num_preemptions", "Preempted requests: none here", LABELS,
                registry=r).labels(*ids)  # fmt: skip
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token")
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Per request: first token to end over the tokens after the first",
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Time between a request's token deliveries, per token",
        )
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency")
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Time waiting for admission"
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds", "Admitted to end: prefill plus decode"
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds", "Admitted to first token"
        )
        self.decode_time = histogram("vllm:request_decode_time_seconds", "First token to end")
        # only a router in front of disaggregated workers has these
        self.rejected = Counter(
            "splitserve_rejected_requests", "Requests refused at admission", ["reason"],
            registry=r,
        )  # fmt: skip
        self.migrations = Counter(
            "splitserve_request_migrations",
            "Requests moved off a worker that died, by the role of that worker",
            ["role"],
            registry=r,
        )
        # every label value from the start: a series that appears only at its first count reads
        # as absent (no data) instead of 0 on a dashboard, and rate() misses that first count
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for role in ("prefill", "decode", "detok"):
            self.migrations.labels(role)
        r.register(WorkerCollector(workers, ids))

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
            self.prefill_time.observe(now - handle.admitted)
        else:
            gap = (now - previous) / n_tokens
            for _ in range(n_tokens):
                self.itl.observe(gap)

    def ended(self, handle: RequestHandle, now: float) -> None:
        assert handle.result is not None
        self.finished[handle.result.finish_reason].inc()
        self.e2e.observe(now - handle.submitted)
        self.inference_time.observe(now - handle.admitted)
        if handle.first_token_at is not None:
            self.decode_time.observe(now - handle.first_token_at)
            if handle.completion_tokens > 1:
                tpot = (now - handle.first_token_at) / (handle.completion_tokens - 1)
                self.tpot.observe(tpot)
        self.prompt_hist.observe(handle.prompt_tokens)
        self.generation_hist.observe(handle.completion_tokens)
        self.max_tokens_hist.observe(handle.params.max_tokens)
        self.max_generation_hist.observe(handle.params.max_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
