"""The server's view of a run: /metrics read before and after, worker figures from the delta.

The decode worker's step time and step gap (start-to-start time of consecutive busy steps), and the
prefill worker's prefill time, reach /metrics as bucketed histograms; the delta of two scrapes is
the distribution seen during the run (its mean exact, its quantiles interpolated inside buckets as
Prometheus' histogram_quantile does, so only as fine as the buckets). Where the router also
exports a worker's recent-window quantiles as gauges (`<name>_recent{quantile="0.99"}`), those
exact figures are reported beside them. Worker series carry an `index` label per worker: the
histograms and counters are summed over the workers, the recent quantiles are the worst worker's.
The token counters are vLLM's names (`vllm:*_tokens_total`), which the router exports.
"""

from __future__ import annotations

import math
import re
from typing import Any

import httpx

from splitserve.bench.stats import QUANTILES, histogram_quantile

SERVER_HISTOGRAMS = {
    "step_gap": "splitserve_decode_step_gap_seconds",
    "step_time": "splitserve_decode_step_seconds",
    "prefill_time": "splitserve_prefill_seconds",
}
COUNTERS = {
    "decode_steps": "splitserve_decode_steps_total",
    "decode_tokens": "splitserve_decode_tokens_total",
    "server_generation_tokens": "vllm:generation_tokens_total",
    "server_prompt_tokens": "vllm:prompt_tokens_total",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str) -> Samples:
    """name -> [(labels, value)] for every sample line of a Prometheus text exposition."""
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def scrape(base_url: str, timeout_s: float = 5.0, api_key: str | None = None) -> Samples | None:
    """The parsed /metrics of base_url, or None when it cannot be read."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s, headers=headers)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return parse_prometheus(resp.text)


def histogram(samples: Samples, name: str) -> dict[str, Any] | None:
    """bounds (finite, ascending), cumulative counts (incl. +Inf), sum, all summed over the
    label sets (one per worker); None when absent."""
    rows = samples.get(name + "_bucket")
    if not rows:
        return None
    by_bound: dict[float, float] = {}
    for labels, value in rows:
        if "le" in labels:
            bound = math.inf if labels["le"] in ("+Inf", "Inf") else float(labels["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + value
    pairs = sorted(by_bound.items())
    total = sum(v for _, v in samples.get(name + "_sum", []))
    return {
        "bounds": [b for b, _ in pairs if b != math.inf],
        "cumulative": [c for _, c in pairs],
        "sum": total,
    }


def histogram_delta(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Per-bucket counts observed between two scrapes (after alone if the worker restarted)."""
    if after is None:
        return None
    cum_after = after["cumulative"]
    cum_before = before["cumulative"] if before else [0.0] * len(cum_after)
    sum_before = before["sum"] if before else 0.0
    if (
        before is None
        or before["bounds"] != after["bounds"]
        or any(a < b for a, b in zip(cum_after, cum_before, strict=True))
    ):
        cum_before, sum_before = [0.0] * len(cum_after), 0.0  # counters reset: a restart
    cum = [a - b for a, b in zip(cum_after, cum_before, strict=True)]
    counts = [cum[0]] + [b - a for a, b in zip(cum, cum[1:], strict=False)]
    return {"bounds": after["bounds"], "counts": counts, "sum": after["sum"] - sum_before}


def summarize_histogram(delta: dict[str, Any] | None) -> dict[str, float] | None:
    """count, mean and bucket-interpolated quantiles of a histogram delta."""
    if delta is None:
        return None
    count = sum(delta["counts"])
    out: dict[str, float] = {
        "count": count,
        "mean": delta["sum"] / count if count else math.nan,
    }
    for key, q in QUANTILES:
        out[key] = histogram_quantile(delta["bounds"], delta["counts"], q)
    return out


def recent_quantiles(samples: Samples | None, name: str) -> dict[str, float] | None:
    """The workers' recent-window quantiles (the worst worker's), when the router exports them."""
    rows = (samples or {}).get(name + "_recent")
    if not rows:
        return None
    by_q: dict[str | None, float] = {}
    for labels, value in rows:
        q = labels.get("quantile")
        by_q[q] = max(value, by_q.get(q, value))
    out = {}
    for key, q in QUANTILES:
        for label in (str(q), f"{q:g}"):
            if label in by_q:
                out[key] = by_q[label]
    return out or None


def counter_value(samples: Samples | None, name: str) -> float | None:
    rows = (samples or {}).get(name)
    return sum(v for _, v in rows) if rows else None


def server_figures(before: Samples | None, after: Samples | None) -> dict[str, Any]:
    """What the server saw during the run: step gap, step time, prefill time, token counters."""
    if after is None:
        return {"available": False}
    out: dict[str, Any] = {"available": True}
    for key, name in SERVER_HISTOGRAMS.items():
        delta = histogram_delta(
            histogram(before, name) if before else None, histogram(after, name)
        )
        out[key] = summarize_histogram(delta)
        out[key + "_recent"] = recent_quantiles(after, name)
    for key, name in COUNTERS.items():
        a, b = counter_value(after, name), counter_value(before, name)
        out[key] = None if a is None else a - (b or 0.0)
    # how full the decode batch ran: served throughput is batch fill x slots / step gap
    slots = counter_value(after, "splitserve_decode_slots")
    steps, tokens = out.get("decode_steps"), out.get("decode_tokens")
    out["batch_fill"] = tokens / (steps * slots) if slots and steps and tokens else None
    return out
