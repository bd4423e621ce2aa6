"""PNG plots of a benchmark: latency distributions (CDFs) and throughput against load.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no display, no
global figure state), so plotting works headless and from threads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

_LATENCIES = (("ttft_s", "time to first token"), ("itl_s", "inter-token latency"),
              ("e2e_s", "end-to-end latency"))  # fmt: skip
_PLAIN = FuncFormatter(lambda value, _pos: f"{value:g}")  # 0.5, 20, 1000: no 10^k notation


def _save(fig: Figure, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def plot_latency(runs: Sequence[dict[str, Any]], path: str, title: str = "") -> str | None:
    """One CDF per run for TTFT, ITL and end-to-end latency (ms, log x). None without samples."""
    runs = [r for r in runs if r.get("_samples")]
    if not runs:
        return None
    fig = Figure(figsize=(15, 4.2))
    axes = fig.subplots(1, 3)
    for ax, (key, name) in zip(axes, _LATENCIES, strict=True):
        lo, hi = math.inf, 0.0
        for r in runs:
            values = sorted(v * 1000.0 for v in r["_samples"].get(key, ()) if v > 0)
            if not values:
                continue
            lo, hi = min(lo, values[0]), max(hi, values[-1])
            n = len(values)
            ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=r["label"])
        ax.set_xscale("log")
        wide = hi > 0 and hi / lo > 300  # over 2.5 decades: label powers of ten only
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(_PLAIN)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of samples")
        ax.grid(True, which="both", alpha=0.3)
        for q in (0.5, 0.99):
            ax.axhline(q, color="grey", linewidth=0.6, linestyle=":")
    axes[0].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_throughput(
    series: Mapping[str, Sequence[dict[str, Any]]],
    path: str,
    x_key: str = "concurrency",
    ceilings: Mapping[str, float] | None = None,
    title: str = "",
) -> str | None:
    """Output tokens/s, TTFT p50 and ITL p50 against load, one line per series (e.g. mode).

    ceilings: horizontal reference lines (engine alone), name -> tokens/s.
    """
    points = {
        name: sorted((r[x_key], r) for r in runs if r.get(x_key) is not None)
        for name, runs in series.items()
    }
    points = {name: p for name, p in points.items() if p}
    if not points:
        return None
    fig = Figure(figsize=(15, 4.2))
    ax_tps, ax_ttft, ax_itl = fig.subplots(1, 3)
    for name, pts in points.items():
        xs = [x for x, _ in pts]
        ax_tps.plot(xs, [r["output_tokens_per_s"] for _, r in pts], marker="o", label=name)
        ax_ttft.plot(xs, [_ms(r["ttft_s"]["p50"]) for _, r in pts], marker="o", label=name)
        ax_itl.plot(xs, [_ms(r["itl_s"]["p50"]) for _, r in pts], marker="o", label=name)
    for name, value in (ceilings or {}).items():
        if value:
            ax_tps.axhline(value, linestyle="--", linewidth=1, color="black")
            ax_tps.annotate(name, (0.01, value), xycoords=("axes fraction", "data"),
                            va="bottom", fontsize="small")  # fmt: skip
    xlabel = "concurrent requests" if x_key == "concurrency" else "request rate (1/s)"
    ticks = sorted({x for pts in points.values() for x, _ in pts})
    for ax, ylabel in ((ax_tps, "output tokens/s"), (ax_ttft, "TTFT p50 (ms)"),
                       (ax_itl, "ITL p50 (ms)")):  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(_PLAIN)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_tps.set_ylim(bottom=0)
    ax_tps.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _ms(value: float | None) -> float:
    return math.nan if value is None else value * 1000.0
