"""What a section's run leaves (bench reports per mode, the ceilings around them) and the
lookups the targets and the document make in it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lab.suite.sections import Section


@dataclass
class SectionResult:
    section: Section
    ceiling: dict[str, Any] | None = None  # the mean of every ceiling run of the section
    mode_ceilings: dict[str, dict[str, Any]] = field(default_factory=dict)  # mode -> its bracket
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)  # mode -> bench report
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def all_runs(res: SectionResult) -> list[dict[str, Any]]:
    return [run for mode in res.section.modes for run in res.reports.get(mode, {}).get("runs", [])]


def find_run(res: SectionResult | None, mode: str, concurrency: int) -> dict[str, Any] | None:
    if res is None:
        return None
    for run in res.reports.get(mode, {}).get("runs", []):
        if run["concurrency"] == concurrency:
            return run
    return None


def server_figures(run: dict[str, Any] | None, key: str) -> tuple[dict[str, Any] | None, str]:
    """A server-side distribution, with where it came from (exact window or buckets)."""
    server = (run or {}).get("server") or {}
    if server.get(key + "_recent"):
        return server[key + "_recent"], "recent-window quantiles"
    return server.get(key), "interpolated from /metrics buckets"

