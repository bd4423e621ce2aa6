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
import json
import logging
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from splitserve.config import ROLES, ClusterConfig, load_config, parse_role_cpus
from splitserve.launcher import ProcessStack, role_instances

log = logging.getLogger("hostlaunch")

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


def health_url(config: ClusterConfig) -> str:
    host = config.router.host
    if host in ("0.0.0.0", "::", ""):  # the router listens everywhere: reach it where it lives
        assert config.addresses is not None
        host = config.addresses.router.split("://", 1)[1].rsplit(":", 1)[0]
        if host in ("*", "0.0.0.0"):
            host = "127.0.0.1"
    return f"http://{host}:{config.router.port}/health"


def local_workers_ready(url: str, expected: set[tuple[str, int]]) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as err:  # 503 while the other host is not up yet
        body = json.loads(err.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return False
    states = {(w["role"], w["index"]): w["state"] for w in body.get("workers", [])}
    return all(states.get(key) == "ready" for key in expected)


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
    stop = {"signal": None}
    signal.signal(signal.SIGTERM, lambda s, f: stop.update(signal=s))
    signal.signal(signal.SIGINT, lambda s, f: stop.update(signal=s))
    stack = ProcessStack(
        config, roles=roles, cpus=cpus, config_path=args.config, log_dir=args.log_dir
    )
    expected = {k for k in role_instances(config, roles) if k[0] != "router"}
    url = health_url(config)
    stack.start()
    try:
        deadline = time.monotonic() + args.ready_timeout
        while not local_workers_ready(url, expected):
            if stop["signal"] is not None:
                return 0
            if time.monotonic() > deadline:
                log.error("not ready after %.0f s (router health at %s)", args.ready_timeout, url)
                return 1
            time.sleep(0.5)
        names = ", ".join(f"{r}[{i}]" for r, i in role_instances(config, roles))
        print(f"launch: host {args.host} ready: {names}", flush=True)
        backoff: dict[tuple[str, int], float] = {}
        while stop["signal"] is None:
            for child in stack.dead():
                key = (child.role, child.index)
                if time.monotonic() >= backoff.get(key, 0.0):
                    log.warning("%s exited (%s): restarting", child.name, child.popen.returncode)
                    stack.spawn(child.role, child.index)
                    backoff[key] = time.monotonic() + 2.0
            time.sleep(0.2)
        return 0
    finally:
        log.info("stopping %s", ", ".join(roles))
        stack.stop(timeout_s=config.lifecycle.drain_timeout_s + 10)


if __name__ == "__main__":
    sys.exit(main())
