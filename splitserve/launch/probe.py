"""`python -m splitserve.launch.probe ROLE INDEX [--url URL] [--live]`: a role's health as the
router sees it, for Kubernetes probes and service managers (exit 0: healthy).

ZeroMQ workers have no HTTP port of their own; the router's /health names every worker and its
state from their Ready messages and heartbeats, which is the real health of each role:
- readiness (the default): the router reports this worker "ready" (for the router itself: /health
  answers 200, a full pipeline admits requests);
- liveness (--live): with --config naming a run_dir, the worker's own progress record there
  (splitserve/progress.py, which the probe reads in the worker's own pod or host) decides, by
  the bounds that a launcher judges it by ([lifecycle] stuck_timeout_s, loop_stuck_timeout_s):
  a stopped or stuck worker is not alive, a busy one (a long prefill or compile) is. Without a
  record (no run_dir, or still warming up), the router does not report this worker "dead"
  (heartbeats stopped while the process runs). A router that does not answer says nothing about
  a worker, so that counts as alive; for the router itself, alive is answering /health at all
  (200 or 503).
"""

from __future__ import annotations

import argparse
import sys
import time

from splitserve.config import ClusterConfig, load_config
from splitserve.launch.health import read_health
from splitserve.progress import progress_path, read_progress, stuck_reason


def healthy(
    role: str, index: int, url: str, live: bool, config: ClusterConfig | None = None
) -> tuple[bool, str]:
    if live and role != "router" and config is not None and config.run_dir:
        record = read_progress(progress_path(config.run_dir, role, index))
        if record is not None:  # the worker's own word, as its launcher reads it
            lc = config.lifecycle
            why = stuck_reason(record, time.monotonic(), lc.stuck_timeout_s,
                               lc.loop_stuck_timeout_s)  # fmt: skip
            return why is None, f"{role}[{index}] {why or 'making progress'}"
    health = read_health(url, timeout_s=3.0)
    if role == "router":
        if health is None:
            return False, f"no answer from {url}"
        return (True, "answering") if live else (health.status == 200, f"HTTP {health.status}")
    if health is None:
        return live, f"no answer from {url}"
    state = health.worker_states().get((role, index), "unknown")
    return (state != "dead") if live else (state == "ready"), f"{role}[{index}] {state}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m splitserve.launch.probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["router", "prefill", "decode", "detok"], help="the role")
    p.add_argument("index", type=int, help="the worker's index within its role")
    p.add_argument("--url", default="http://127.0.0.1:8000/health", help="the router's /health")
    p.add_argument("--live", action="store_true", help="liveness instead of readiness")
    p.add_argument("--config", help="the cluster file: with --live, the worker's progress "
                   "record in its run_dir decides")  # fmt: skip
    args = p.parse_args(argv)
    config = None
    if args.config:
        try:
            config = load_config(args.config)
        except (OSError, ValueError, KeyError) as exc:  # the router's view, as without it
            print(f"cluster file {args.config} not read ({exc}): the router's view decides")
    ok, why = healthy(args.role, args.index, args.url, args.live, config)
    print(why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
