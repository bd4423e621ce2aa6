"""The shared entry point of the worker roles: `python -m <role> --config FILE [--index K]`.

Builds the configuration once, configures logging, turns SIGTERM / SIGINT into a drain (running
requests finish, up to lifecycle.drain_timeout_s), and exits non-zero on a fatal error so that a
supervisor restarts the process.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import zmq

from splitserve import logfmt, run_dirs
from splitserve.config import load_config
from splitserve.model_source import check_model
from splitserve.procutil import PARENT_ENV, die_with_parent, pin_cpus, place_io_threads


def configure_logging(role: str, index: int, level: str, fmt: str = "text") -> None:
    logfmt.configure(f"{role}[{index}]", level, fmt)
    # JAX's probe for a TPU logs an "Unable to initialize backend 'tpu'" line at info level on
    # every machine without one: noise in every cold start's output
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


def add_log_args(p: argparse.ArgumentParser) -> None:
    """--log-level and --log-format, defaulting to SPLITSERVE_LOG_LEVEL / SPLITSERVE_LOG_FORMAT."""
    p.add_argument(
        "--log-level", default=os.environ.get(logfmt.LEVEL_ENV, "info"),
        choices=logfmt.LEVELS, type=str.lower,
        help=f"log level (default: ${logfmt.LEVEL_ENV} or info)",
    )  # fmt: skip
    p.add_argument(
        "--log-format", default=os.environ.get(logfmt.FORMAT_ENV, "text"),
        choices=logfmt.FORMATS, help=f"log format (default: ${logfmt.FORMAT_ENV} or text)",
    )  # fmt: skip


def parse_args(role: str, argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {role}_worker", description=f"splitserve {role}")
    p.add_argument("--config", required=True, help="cluster TOML file")
    p.add_argument("--index", type=int, default=0, help="which worker of this role")
    add_log_args(p)
    return p.parse_args(argv)


def run_role(role: str, worker_cls, argv: list[str] | None = None) -> int:
    args = parse_args(role, argv)
    configure_logging(role, args.index, args.log_level, args.log_format)
    log = logging.getLogger(f"{role}_worker")
    die_with_parent(os.environ)
    pin_cpus(os.environ)
    try:
        config = load_config(args.config)
    except (OSError, ValueError, KeyError) as exc:
        log.error("bad configuration %s: %s", args.config, exc)
        return 2
    try:
        # before the worker is built: a model path this host lacks is one line, not a traceback
        check_model(config.model, weights=role in ("prefill", "decode"))
        hold_place(config, role, args.index)
    except (OSError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    stop = threading.Event()
    built: list = []  # the worker, once constructed

    def on_signal(signum, _frame):
        if not built or not built[0].startup.finished:
            # Still loading or compiling: nothing to drain, and a compile cannot be cut short,
            # so waiting would only hold up the stop (the launcher's Ctrl-C) for its length.
            log.info("signal %d while starting: nothing to drain, exiting now", signum)
            # the executable store's module, if the engine loaded it
            store = sys.modules.get("splitserve.engine.compile.executables")
            if store is not None:  # programs it is loading now did not crash this process
                store.abandon_loads()
            logging.shutdown()
            os._exit(0)
        log.info("signal %d: draining", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ctx = zmq.Context()
    place_io_threads(ctx, os.environ)
    try:
        worker = worker_cls(config, args.index, ctx, stop, dict(os.environ))
        built.append(worker)
        worker.run()
    except Exception:
        log.exception("fatal error; exiting so that the supervisor restarts this worker")
        return 1
    finally:
        ctx.destroy(linger=0)
    return 0


def hold_place(config, role: str, index: int) -> int | None:
    """This process's lock in the run directory (splitserve/run_dirs.py), held until it exits:
    a second copy of it, or a process of a second stack, is refused here, before it binds a
    socket. None without a run directory (tcp [addresses] only)."""
    if not config.run_dir:
        return None
    run_dirs.ensure_private_dir(config.run_dir)
    return run_dirs.hold_for_role(config.run_dir, role, index, os.environ.get(PARENT_ENV))
