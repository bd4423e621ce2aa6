"""The router process: `python -m router --config FILE [--log-level LEVEL] [--log-format F]`.

A request's path through this process (one asyncio event loop serves HTTP and the ZeroMQ sockets):
 1. uvicorn accepts the connection, within the limits of router/http/connections.py (header and
    body timeouts, connections per peer and in all); the middleware reads or makes the
    X-Request-Id, checks the API key and bounds the body size (router/http/app.py).
 2. The endpoint validates the body (pydantic, router/http/schemas.py), renders the chat template
    for chat requests, and tokenizes the prompt. A client's grammar (structured output, tool
    calls) is compiled, and a request's own chat template or a large chat rendered, in a
    contained child process under a time limit (router/contained/), never on this loop.
 3. One core request per choice is submitted under the request id (`<id>-<i>` when there are
    several): the core validates, admits or refuses (400 / 429 / 503), picks the detok worker on
    the hash ring and sends the request to the prefill worker (router/core.py).
 4. Text deltas come back from the detok workers through the core's reader task; the endpoint
    merges the choices' deltas into SSE chunks, or into one JSON response when not streaming.
 5. A client that disconnects gets its requests aborted, which frees their slots in every worker.
 6. On SIGTERM the core stops admitting, running requests finish for up to
    lifecycle.drain_timeout_s, and the process exits; a second signal exits at once.

In threads mode (cluster.mode = "threads") the launcher runs this process's serve() beside every
worker role as a thread (`python -m splitserve.launch.threads_main`), handing it the zmq context
of their inproc sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys

import prometheus_client
import uvicorn
import uvloop
import zmq

from router.contained.metrics import PoolCollector
from router.core import RouterCore
from router.http import build_app
from router.http.connections import ConnectionGuard, connection_capacity, guarded_protocol
from splitserve.config import ClusterConfig, load_config
from splitserve.config.checks import check_admin_key
from splitserve.model_source import check_model
from splitserve.procutil import (
    ADMIN_KEY_ENV,
    API_KEY_ENV,
    die_with_parent,
    freeze_startup_objects,
    pin_cpus,
)
from splitserve.role_main import add_log_args, configure_logging, hold_place
from splitserve.tokenizer_path import tokenizer_path
from splitserve.tokenizers import Tokenizer, load_tokenizer
from splitserve.tokenizers.chat_sources import use_template_file

log = logging.getLogger("router")

SHUTDOWN_GRACE_S = 5.0  # after the drain: for responses still being written


class QuietUvicornStart(logging.Filter):
    """uvicorn's start-up lines ("Uvicorn running on ...") come as soon as the port is bound,
    minutes before a cold stack can answer; announce() says instead what the router serves when."""

    DROPPED = ("Uvicorn running on", "Started server process", "Waiting for application",
               "Application startup")  # fmt: skip

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.DROPPED)


async def announce(server: uvicorn.Server, core: RouterCore, url: str) -> None:
    """Say what is true: the port is open but answers 503 until a full pipeline is ready,
    then that the router admits requests."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    if core.is_ready():
        log.info("ready: serving on %s", url)
        return
    log.info("listening on %s: /health answers 503 until every role has a ready worker", url)
    while not core.is_ready():
        await asyncio.sleep(0.1)
    log.info("ready: a full pipeline is up, serving on %s", url)


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM / SIGINT turned into a drain of the core before the server stops."""

    def __init__(self, config: uvicorn.Config, core: RouterCore, drain_timeout_s: float):
        super().__init__(config)
        self.core = core
        self.drain_timeout_s = drain_timeout_s
        self.draining: asyncio.Task | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.on_signal, sig)
        try:
            yield
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def on_signal(self, sig: int) -> None:
        if self.draining is None:
            log.info("signal %d: draining for up to %.0f s", sig, self.drain_timeout_s)
            self.draining = asyncio.get_running_loop().create_task(self.drain())
        else:
            log.warning("signal %d again: exiting now", sig)
            self.should_exit = True
            self.force_exit = True

    async def drain(self) -> None:
        try:
            await self.core.drain(self.drain_timeout_s)
        finally:
            self.should_exit = True


async def serve(
    config: ClusterConfig, tokenizer: Tokenizer, ctx: zmq.Context | None = None
) -> None:
    """ctx: the zmq context to share (threads mode: the worker threads'); else one of its own."""
    core = RouterCore(config, tokenizer.vocab_size, tokenizer.eos_ids, ctx=ctx)
    try:
        await core.start()
        app = build_app(core, tokenizer, config)
        core.metrics.registry.register(PoolCollector(app.state.ctx.contained.pool))
        r = config.router
        guard = ConnectionGuard(r, connection_capacity(r.max_connections))
        server = DrainingServer(
            uvicorn.Config(
                app,
                host=r.host,
                port=r.port,
                log_config=None,  # keep this process's logging format
                access_log=False,  # the core logs each request by id
                lifespan="off",
                # httptools (C parser: a fraction of h11's cost per request), with the guard of
                # the client connections (timeouts, per-peer and total limits)
                http=guarded_protocol(guard),
                timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                # not uvicorn's own: it counts idle and trickling connections too, and answers
                # everyone 503 once they fill it; the guard bounds connections, admission requests
                limit_concurrency=None,
            ),
            core,
            config.lifecycle.drain_timeout_s,
        )
        freeze_startup_objects()
        announcing = asyncio.create_task(announce(server, core, f"http://{r.host}:{r.port}"))
        try:
            await server.serve()
        finally:
            announcing.cancel()
            guard.close()
            await app.state.ctx.close()  # its contained children (router/contained/)
        if not server.started:
            raise RuntimeError(f"could not serve HTTP on {r.host}:{r.port}")
    finally:
        await core.close()


def with_api_key_from_env(config: ClusterConfig, environ: dict[str, str]) -> ClusterConfig:
    """The API key comes from the cluster file's api_key_file or from SPLITSERVE_API_KEY (which
    wins), never from a command line: /proc/PID/cmdline is readable by every local user. The
    admin key likewise: admin_key_file or SPLITSERVE_ADMIN_KEY."""
    keys = {field: environ.get(name, "") for field, name in (("api_key", API_KEY_ENV),
                                                             ("admin_key", ADMIN_KEY_ENV))}
    keys = {field: key for field, key in keys.items() if key}
    if not keys:
        return config
    router = check_admin_key(dataclasses.replace(config.router, **keys))
    return dataclasses.replace(config, router=router)


def main(argv: list[str] | None = None, serve_fn=serve) -> int:
    """serve_fn(config, tokenizer): the coroutine that serves; threads mode's starts the workers."""
    p = argparse.ArgumentParser(prog="python -m router", description="splitserve router")
    p.add_argument("--config", required=True, help="cluster TOML file")
    p.add_argument("--index", type=int, default=0, help="accepted for the launcher; one router")
    add_log_args(p)
    args = p.parse_args(argv)
    configure_logging("router", args.index, args.log_level, args.log_format)
    logging.getLogger("uvicorn.error").addFilter(QuietUvicornStart())
    # vLLM's /metrics has no `_created` series either; a process-wide switch, set here only
    prometheus_client.disable_created_metrics()
    die_with_parent(os.environ)
    pin_cpus(os.environ)
    try:
        config = with_api_key_from_env(load_config(args.config), os.environ)
        check_model(config.model, weights=False)  # its tokenizer: the model's own, or named
        hold_place(config, "router", args.index)  # one router to a run dir (run_dirs.py)
        tokenizer = load_tokenizer(tokenizer_path(config.model))
        use_template_file(tokenizer, config.model.chat_template)  # --chat-template FILE
    except (OSError, ValueError, KeyError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    if config.mode == "threads" and serve_fn is serve:
        log.error("cluster.mode is 'threads': start it with `splitserve serve` (or `python -m "
                  "splitserve.launch.threads_main`), which runs the workers beside the router")
        return 2
    try:
        # uvloop: the router's event loop carries every HTTP stream and every zmq message, and
        # uvloop runs that loop at a fraction of the default loop's cost per callback.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve_fn(config, tokenizer))
    except Exception:
        log.exception("fatal error; exiting so that the supervisor restarts the router")
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
