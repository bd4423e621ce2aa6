"""The figures of one run, computed from per-request results.

Quantiles are splitserve.stats.quantiles' (linear between closest ranks, as the workers' own):
p50 of [1, 2, 3, 4] is 2.5. Latencies are in seconds throughout; reports convert to milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from splitserve.stats import quantiles

QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


def distribution(values: Sequence[float]) -> dict[str, float]:
    """count, mean, p50, p90, p99, max (NaN figures, count 0, when there are no values)."""
    out: dict[str, float] = {"count": len(values)}
    out["mean"] = sum(values) / len(values) if values else math.nan
    figures = quantiles(values, [q for _, q in QUANTILES])
    out.update((name, x) for (name, _), x in zip(QUANTILES, figures, strict=True))
    out["max"] = max(values) if values else math.nan
    return out


def summarize(results: Sequence[Any], duration_s: float) -> dict[str, Any]:
    """The figures of one run from its RequestResults (client.py) and its wall time.

    - output_tokens_per_s: completion tokens (server usage) of successful requests / duration.
    - ttft: send to first chunk with text; e2e: send to the end of the stream.
    - itl: gaps between consecutive text chunks (a chunk may carry several tokens).
    - first_gap: per request, the gap between its first and second text chunks: the pause a
      client sees when the first token (from prefill) arrives well before the request gets a
      decode slot. One of a request's many ITL gaps, so it hardly moves the ITL quantiles.
    - tpot: per request, (e2e - ttft) / (completion_tokens - 1): time per output token.
    - steady_output_tokens_per_s: tokens delivered in the middle 80% of the run (the tokens of a
      request spread evenly over its chunks), without the ramp-up and the tail.
    """
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    itl: list[float] = []
    first_gap: list[float] = []
    tpot: list[float] = []
    for r in ok:
        times = r.chunk_times
        itl.extend(b - a for a, b in zip(times, times[1:], strict=False))
        if len(times) > 1:
            first_gap.append(times[1] - times[0])
        if r.completion_tokens > 1 and r.ttft is not None and r.e2e is not None:
            tpot.append((r.e2e - r.ttft) / (r.completion_tokens - 1))
    errors: dict[str, int] = {}
    for r in failed:
        key = (r.error or "unknown")[:120]
        errors[key] = errors.get(key, 0) + 1
    return {
        "requests_ok": len(ok),
        "requests_failed": len(failed),
        "errors": errors,
        "duration_s": duration_s,
        "output_tokens": out_tokens,
        "prompt_tokens": prompt_tokens,
        "usage_reported": all(r.usage_reported for r in ok),
        "mean_prompt_tokens": prompt_tokens / len(ok) if ok else math.nan,
        "mean_output_tokens": out_tokens / len(ok) if ok else math.nan,
        "output_tokens_per_s": out_tokens / duration_s if duration_s > 0 else math.nan,
        "steady_output_tokens_per_s": steady_throughput(ok),
        "requests_per_s": len(ok) / duration_s if duration_s > 0 else math.nan,
        "ttft_s": distribution(ttft),
        "itl_s": distribution(itl),
        "first_gap_s": distribution(first_gap),
        "tpot_s": distribution(tpot),
        "e2e_s": distribution(e2e),
    }


def steady_throughput(ok: Sequence[Any], trim: float = 0.1) -> float:
    """Output tokens/s over the middle (1 - 2 * trim) of the span from first send to last end."""
    if not ok:
        return math.nan
    start = min(r.start for r in ok)
    end = max(r.start + r.e2e for r in ok if r.e2e is not None)
    lo, hi = start + trim * (end - start), end - trim * (end - start)
    if hi <= lo:
        return math.nan
    tokens = 0.0
    for r in ok:
        if not r.chunk_times or not r.completion_tokens:
            continue
        per_chunk = r.completion_tokens / len(r.chunk_times)
        tokens += per_chunk * sum(1 for t in r.chunk_times if lo <= r.start + t <= hi)
    return tokens / (hi - lo)


def histogram_quantile(bounds: Sequence[float], counts: Sequence[float], q: float) -> float:
    """The q-quantile of a bucketed histogram, as Prometheus' histogram_quantile computes it.

    bounds: the finite upper bounds, ascending; counts: per-bucket (not cumulative) counts, one
    more than bounds (the last is the +Inf bucket). Linear interpolation inside a bucket, lower
    bound 0 for the first; a quantile that falls in +Inf gives the largest finite bound.
    """
    if len(counts) != len(bounds) + 1:
        raise ValueError("need one count per bound plus the +Inf bucket")
    total = sum(counts)
    if total <= 0:
        return math.nan
    target = q * total
    cumulative = 0.0
    for i, count in enumerate(counts):
        if count > 0 and cumulative + count >= target:
            if i == len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (target - cumulative) / count
        cumulative += count
    return bounds[-1]
