"""`splitserve keys generate DIR --config FILE`: a CURVE keypair for every process of the cluster
file (splitserve/security.py has the scheme), kept where one exists already.

Then set [security] keys_dir = "DIR" in the file, and give each host the public keys of all
(`*.key`) and the secret keys (`*.key_secret`, 0600) of its own processes only: the command
lists which those are when the file has [hosts] tables.
"""

from __future__ import annotations

import argparse
import os

from splitserve.config import ROLES, load_config
from splitserve.hosts import host_plans
from splitserve.security import SECRET_SUFFIX, generate_keys, process_name


def add_keys_parser(sub) -> None:
    keys = sub.add_parser("keys", help="CURVE keys for the cluster's tcp links")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    gen = keys_sub.add_parser("generate", help="a keypair per process of the cluster file")
    gen.add_argument("dir", help="where the keys go (the file's [security] keys_dir)")
    gen.add_argument("--config", required=True, help="the cluster TOML file")
    gen.add_argument("--extra-detok", type=int, default=0,
                     help="keys for this many more detok workers (a pool that grows)")  # fmt: skip
    gen.set_defaults(run=generate)


def cluster_names(config, extra_detok: int = 0) -> list[str]:
    names = []
    for role in ROLES:
        count = config.count(role) + (extra_detok if role == "detok" else 0)
        names += [process_name(role, i) for i in range(count)]
    return names


def generate(args: argparse.Namespace) -> int:
    os.makedirs(args.dir, mode=0o755, exist_ok=True)  # the file is read as if it named it
    config = load_config(args.config, {"security": {"keys_dir": args.dir}}, _no_run_dir)
    made = generate_keys(args.dir, cluster_names(config, args.extra_detok))
    print(f"keys in {args.dir}: made {', '.join(made) or 'none (all there already)'}")
    for name, plan in host_plans(config).items():
        secrets = [process_name(r, i) + SECRET_SUFFIX for r, i in plan.instances]
        print(f"  host {name}: every *.key, and {', '.join(secrets)}")
    print(f'set [security] keys_dir = "{args.dir}" in {args.config}')
    return 0


def _no_run_dir() -> str:
    """Nothing runs here: a file without a run_dir is read for its process counts only."""
    return os.path.join(os.sep, "nonexistent-run-dir")
