"""Start the processes one host of a cluster file runs: `python -m splitserve.hostlaunch HOST FILE`.

deploy/launch.sh calls this on each host. The [hosts.<HOST>] table names the roles, or single
workers of a role (splitserve/hosts.py; default: router and prefill on "prefill-host", decode and
the detok pool on "decode-host") and, optionally, the CPUs each role is pinned to:

    [hosts.decode-a]
    roles = ["decode:0", "detok:0-1"]
    cpus = { decode = [0], detok = [1] }

It waits until the router reports every local worker ready (GET /health on the router's host),
prints a ready line, restarts a local role that exits (with a back-off) or, with a run_dir, a
worker that stopped making progress (launch/stuck.py), and on SIGTERM / SIGINT
stops its roles: the router first, which lets running requests finish up to the drain timeout.
"""

from __future__ import annotations

import argparse
import logging
import sys

from splitserve.config import load_config
from splitserve.hosts import host_plan, host_plans
from splitserve.launch.health import StackNotReady, health_url, wait_ready, workers_ready
from splitserve.launch.processes import ProcessStack
from splitserve.launch.stuck import StuckWatch
from splitserve.launch.supervise import RestartWithBackoff, StopSignals, supervise

log = logging.getLogger("hostlaunch")

RESTART_BACKOFF_S = 2.0  # a role that keeps crashing is started again at most this often


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="launch.sh", description=__doc__.split("\n")[0])
    p.add_argument("host", help="which [hosts.<name>] of the cluster file this machine is")
    p.add_argument("config", help="cluster TOML file")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--log-dir", default=None, help="per-process logs (default: this terminal)")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s launch[{args.host}] %(levelname)s: %(message)s"
    )
    try:
        config = load_config(args.config)
        # every host checked (no process given to two), then this one's (prefill-host and
        # decode-host have defaults)
        plan = host_plans(config).get(args.host) or host_plan(config, args.host)
    except (OSError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    stop = StopSignals().install()
    stack = ProcessStack(
        config, roles=plan.roles, cpus={r: list(c) for r, c in plan.cpus.items()},
        config_path=args.config, log_dir=args.log_dir, instances=plan.instances,
    )  # fmt: skip
    local_ready = workers_ready(k for k in plan.instances if k[0] != "router")
    url = health_url(config)
    stack.start()
    try:
        try:
            if not wait_ready(url, args.ready_timeout, local_ready, stop=stop.event):
                return 0
        except StackNotReady:
            log.error("not ready after %.0f s (router health at %s)", args.ready_timeout, url)
            return 1
        names = ", ".join(f"{r}[{i}]" for r, i in plan.instances)
        print(f"launch: host {args.host} ready: {names}", flush=True)
        supervise(stack, RestartWithBackoff(backoff_s=RESTART_BACKOFF_S), stop.event,
                  stuck=StuckWatch(config.run_dir, config.lifecycle))  # fmt: skip
        return 0
    finally:
        log.info("stopping %s", ", ".join(plan.roles))
        stack.stop(timeout_s=config.lifecycle.drain_timeout_s + 10)


if __name__ == "__main__":
    sys.exit(main())
