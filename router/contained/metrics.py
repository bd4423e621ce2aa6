"""The contained pool's figures in the router's /metrics, read at scrape time:

- splitserve_contained_jobs{state="running" | "waiting"}: jobs on a child, and waiting for one;
- splitserve_contained_jobs_ended{outcome}: jobs by how they ended: "ok", "refused" (the input
  was refused: 400), "crashed" (the job ended its child), "time_limit" (its child was killed),
  "busy" (turned away: 429).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from router.contained.pool import OUTCOMES, ContainedPool


class PoolCollector(Collector):
    def __init__(self, pool: ContainedPool):
        self.pool = pool

    def collect(self) -> Iterator:
        jobs = GaugeMetricFamily("splitserve_contained_jobs",
                                 "Grammar and chat-template jobs of the router's contained"
                                 " children, running and waiting", labels=["state"])  # fmt: skip
        jobs.add_metric(["running"], self.pool.running())
        jobs.add_metric(["waiting"], self.pool.waiting)
        yield jobs
        ended = CounterMetricFamily("splitserve_contained_jobs_ended",
                                    "Contained jobs by how they ended", labels=["outcome"])
        for outcome in OUTCOMES:
            ended.add_metric([outcome], self.pool.ended[outcome])
        yield ended
