"""`splitserve deploy supervisord [--host NAME] FILE [-o OUT]`: write the supervisord config of
one host of the cluster file (every process of the file without --host: one machine), by default
beside the file as supervisord.conf or supervisord-NAME.conf. The shipped deploy/supervisord*.conf
are its outputs for the shipped cluster files (`make deploy-configs`)."""

from __future__ import annotations

import argparse
import os

import splitserve
from splitserve.config import load_config
from splitserve.deploy.supervisord import render
from splitserve.hosts import HostPlan, host_plan, host_plans
from splitserve.launch.roles import role_instances, stack_roles

# the checkout this package runs from (its .venv holds the python the programs run)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(splitserve.__file__)))


def add_deploy_parser(sub) -> None:
    deploy = sub.add_parser("deploy", help="deployment configs generated from the cluster file")
    deploy_sub = deploy.add_subparsers(dest="deploy_command", required=True)
    sv = deploy_sub.add_parser("supervisord", help="a host's supervisord config")
    sv.add_argument("config", help="the cluster TOML file")
    sv.add_argument("--host", help="which [hosts.NAME] (default: every process, one machine)")
    sv.add_argument("-o", "--out", help="where to write (default: beside the cluster file)")
    sv.add_argument("--python", default=os.path.join(CHECKOUT, ".venv", "bin", "python"),
                    help="the python the programs run (default: the checkout's .venv)")
    sv.add_argument("--home", default=CHECKOUT, help="the programs' working directory")
    sv.set_defaults(run=write_supervisord)


def default_out(config_path: str, host: str | None) -> str:
    name = f"supervisord-{host}.conf" if host else "supervisord.conf"
    return os.path.join(os.path.dirname(os.path.abspath(config_path)), name)


def plan_for(config, host: str | None) -> HostPlan:
    if host is None:
        instances = tuple(role_instances(config, stack_roles(config)))
        return HostPlan("one machine", instances, config.cpus)
    plan = host_plans(config).get(host) or host_plan(config, host)
    return HostPlan(f"host {host}", plan.instances, plan.cpus)


def supervisord_text(config_path: str, host: str | None, out: str, python: str, home: str) -> str:
    config = load_config(config_path)
    shown = os.path.relpath(os.path.abspath(config_path), home)
    source = f"splitserve deploy supervisord{f' --host {host}' if host else ''} {shown}"
    return render(config, plan_for(config, host), config_path, out, python, home, source)


def write_supervisord(args: argparse.Namespace) -> int:
    out = args.out or default_out(args.config, args.host)
    text = supervisord_text(args.config, args.host, out, args.python, args.home)
    with open(out, "w") as fh:
        fh.write(text)
    print(f"wrote {out}")
    return 0
