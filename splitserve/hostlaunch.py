"""Start the roles one host of a cluster file runs: `python -m splitserve.hostlaunch HOST FILE`.

deploy/launch.sh calls this on each host (one prefill host plus one decode host, say). The
[hosts.<HOST>] table names the roles (default: router and prefill on "prefill-host", decode and
the detok pool on "decode-host") and, optionally, the CPUs each role is pinned to:

    [hosts.decode-host]
    roles = ["decode", "detok"]
    cpus = { decode = [0], detok = [1] }

It waits until the router reports every local worker ready (GET /health on the router's host),
prints a ready line, restarts a local role that exits (with a back-off), and on SIGTERM / SIGINT
stops its roles: the router first, which lets running requests finish up to the drain timeout.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from splitserve.config import ROLES, ClusterConfig, load_config, parse_role_cpus
from splitserve.launch.health import StackNotReady, health_url, wait_ready, workers_ready
from splitserve.launch.processes import ProcessStack
from splitserve.launch.roles import role_instances
from splitserve.launch.supervise import RestartWithBackoff, StopSignals, supervise

log = logging.getLogger("hostlaunch")

RESTART_BACKOFF_S = 2.0  # a role that keeps crashing is started again at most this often

DEFAULT_ROLES = {"prefill-host": ["router", "prefill"], "decode-host": ["decode", "detok"]}


def host_plan(config: ClusterConfig, host: str) -> tuple[list[str], dict[str, list[int]]]:
    table: dict[str, Any] = dict(config.hosts.get(host, {}))
    roles = list(table.get("roles", DEFAULT_ROLES.get(host, [])))
    if not roles:
        raise ValueError(f"host {host!r} has no roles: add [hosts.{host}] roles = [...]")
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"host {host!r}: unknown roles {sorted(unknown)}")
    cpus = parse_role_cpus(dict(table.get("cpus", {})), f"[hosts.{host}.cpus]")
    return roles, {role: list(cs) for role, cs in cpus.items()}


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
    config = load_config(args.config)
    roles, cpus = host_plan(config, args.host)
    stop = StopSignals().install()
    stack = ProcessStack(
        config, roles=roles, cpus=cpus, config_path=args.config, log_dir=args.log_dir
    )
    local_ready = workers_ready(k for k in role_instances(config, roles) if k[0] != "router")
    url = health_url(config)
    stack.start()
    try:
        try:
            if not wait_ready(url, args.ready_timeout, local_ready, stop=stop.event):
                return 0
        except StackNotReady:
            log.error("not ready after %.0f s (router health at %s)", args.ready_timeout, url)
            return 1
        names = ", ".join(f"{r}[{i}]" for r, i in role_instances(config, roles))
        print(f"launch: host {args.host} ready: {names}", flush=True)
        supervise(stack, RestartWithBackoff(backoff_s=RESTART_BACKOFF_S), stop.event)
        return 0
    finally:
        log.info("stopping %s", ", ".join(roles))
        stack.stop(timeout_s=config.lifecycle.drain_timeout_s + 10)


if __name__ == "__main__":
    sys.exit(main())
