"""Reports: the JSON record of a benchmark and Markdown tables (milliseconds for latencies).

A report is a dict: {"settings": ..., "runs": [run, ...], "ceiling": optional}. Keys that start
with "_" (raw samples, kept for the plots) stay out of the JSON unless asked for.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any


def strip_private(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip_private(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, list):
        return [strip_private(v) for v in value]
    return value


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_json(report: dict[str, Any], path: str, samples: bool = False) -> None:
    data = report if samples else strip_private(report)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(_json_safe(data), fh, indent=2, ensure_ascii=False, allow_nan=False)
        fh.write("\n")


def fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value * scale:,.{digits}f}"


def _ms(dist: dict[str, Any] | None, key: str) -> str:
    return fmt((dist or {}).get(key), 1000.0, 1)


def _pair_ms(dist: dict[str, Any] | None) -> str:
    return f"{_ms(dist, 'p50')} / {_ms(dist, 'p99')}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def load_table(runs: Sequence[dict[str, Any]], name_key: str = "label") -> str:
    """One row per run: throughput and the p50 / p99 of each latency."""
    header = [
        "load", "ok / failed", "out tok/s", "steady tok/s", "of ceiling", "req/s",
        "TTFT p50 / p99 ms", "ITL p50 / p99 ms", "TPOT p50 ms", "E2E p50 / p99 ms",
        "step gap p50 / p99 ms", "step p50 ms", "batch fill",
    ]  # fmt: skip
    rows = []
    for r in runs:
        server = r.get("server") or {}
        gap = server.get("step_gap_recent") or server.get("step_gap")
        step = server.get("step_time_recent") or server.get("step_time")
        frac = r.get("fraction_of_ceiling")
        rows.append([
            str(r.get(name_key, "")),
            f"{r['requests_ok']} / {r['requests_failed']}",
            fmt(r["output_tokens_per_s"], digits=0),
            fmt(r["steady_output_tokens_per_s"], digits=0),
            "–" if frac is None else f"{frac:.0%}",
            fmt(r["requests_per_s"], digits=2),
            _pair_ms(r["ttft_s"]),
            _pair_ms(r["itl_s"]),
            _ms(r["tpot_s"], "p50"),
            _pair_ms(r["e2e_s"]),
            _pair_ms(gap),
            _ms(step, "p50"),
            "–" if server.get("batch_fill") is None else f"{server['batch_fill']:.0%}",
        ])  # fmt: skip
    return table(header, rows)


def distribution_table(runs: Sequence[dict[str, Any]], name_key: str = "label") -> str:
    """Every latency figure of every run: mean, p50, p90, p99, max in milliseconds."""
    header = ["load", "metric", "mean", "p50", "p90", "p99", "max", "n"]
    rows = []
    for r in runs:
        server = r.get("server") or {}
        metrics = [
            ("TTFT", r["ttft_s"]), ("ITL", r["itl_s"]),
            ("first to second chunk", r.get("first_gap_s")), ("TPOT", r["tpot_s"]),
            ("E2E", r["e2e_s"]), ("decode step gap (server)", server.get("step_gap")),
            ("decode step (server)", server.get("step_time")),
        ]  # fmt: skip
        for name, dist in metrics:
            if not dist:
                continue
            rows.append(
                [str(r.get(name_key, "")), name]
                + [_ms(dist, k) for k in ("mean", "p50", "p90", "p99", "max")]
                + [str(int(dist.get("count", 0)))]
            )
    return table(header, rows)


def model_name(model: str) -> str:
    """A model path's file or folder name (random:<preset> and names stay as they are)."""
    return os.path.basename(model.rstrip("/")) if os.sep in model else model


def ceiling_table(ceilings: Sequence[dict[str, Any]]) -> str:
    header = [
        "model", "engine", "slots", "context", "tokens/s", "step mean / p50 / p90 ms",
        "prefill tokens", "prefill p50 ms",
    ]  # fmt: skip
    rows = []
    for c in ceilings:
        rows.append([
            f"`{model_name(c['model'])}`", c["engine"], str(c["slots"]), str(c["context"]),
            fmt(c.get("tokens_per_s"), digits=0),
            " / ".join(_ms(c.get("step_s"), q) for q in ("mean", "p50", "p90")),
            str(c["prompt_tokens"]), _ms(c.get("prefill_s"), "p50"),
        ])  # fmt: skip
    return table(header, rows)


def settings_line(settings: dict[str, Any]) -> str:
    parts = [
        f"prompt {settings.get('prompt_tokens')} tokens",
        f"output {settings.get('output_tokens')} tokens"
        + (f" ±{settings['output_spread']:.0%}" if settings.get("output_spread") else "")
        + " (ignore_eos)",
    ]
    if settings.get("unicode_prompts"):
        parts.append("multi-byte UTF-8 prompts")
    if settings.get("stop"):
        parts.append(f"{len(settings['stop'])} stop strings")
    if settings.get("temperature"):
        parts.append(f"temperature {settings['temperature']}")
    return ", ".join(parts)


def markdown(report: dict[str, Any], title: str = "Benchmark") -> str:
    """The report of one `splitserve bench` invocation as a Markdown page."""
    s = report.get("settings", {})
    out = [f"# {title}\n", f"Endpoint `{s.get('url', '')}`: {settings_line(s)}.\n"]
    if report.get("runs"):
        out += ["## Throughput and latency\n", load_table(report["runs"])]
        out += ["\n## Latency distributions (ms)\n", distribution_table(report["runs"])]
    if report.get("ceiling"):
        out += ["\n## Engine ceiling\n", ceiling_table([report["ceiling"]])]
    return "\n".join(out)


def write_markdown(text: str, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
