"""The engine ceiling a served load is judged against: the measurements on either side of it."""

from __future__ import annotations

import statistics
from typing import Any


def bracketed(runs: list[dict[str, Any] | None]) -> dict | None:
    """One ceiling from several runs of it (those on either side of some served loads): the
    mean of their rates and step figures. On a shared host the engine's speed drifts over
    minutes; a ceiling taken on one side only of the served runs would carry that drift into the
    served/ceiling ratio."""
    runs = [c for c in runs if c]
    if len(runs) < 2:
        return runs[0] if runs else None
    mean = lambda key, q="p50": statistics.fmean(c[key][q] for c in runs)  # noqa: E731
    first = runs[0]
    out = dict(first)
    out["tokens_per_s"] = statistics.fmean(c["tokens_per_s"] for c in runs)
    out["tokens_per_s_p50"] = statistics.fmean(c["tokens_per_s_p50"] for c in runs)
    quantiles = ("mean", "p50", "p90", "p99")
    out["step_s"] = {**first["step_s"], **{q: mean("step_s", q) for q in quantiles}}
    out["prefill_s"] = {**first["prefill_s"], "p50": mean("prefill_s")}
    out["bracket"] = [{"tokens_per_s": c["tokens_per_s"], "step_mean_s": c["step_s"]["mean"],
                       "step_p50_s": c["step_s"]["p50"], "prefill_p50_s": c["prefill_s"]["p50"]}
                      for c in runs]  # fmt: skip
    return out


def compact(ceiling: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a run keeps of the ceiling it is judged against."""
    if ceiling is None:
        return None
    keep = ("tokens_per_s", "tokens_per_s_p50", "step_s", "prefill_s", "bracket")
    return {k: ceiling[k] for k in keep if k in ceiling}

