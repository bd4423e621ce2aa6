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
import logging
import os
import sys

from splitserve.config import load_config


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="cluster TOML file (defaults: one host, default model)")
    p.add_argument("--model", help="model: a .gguf file, a Hugging Face folder, random:<preset>")
    p.add_argument("--tokenizer", help="tokenizer path when the model has none of its own")
    p.add_argument("--engine", choices=["jax", "fake"])
    p.add_argument("--mode", choices=["processes", "threads"])
    p.add_argument("--detok-workers", type=int)
    p.add_argument("--slots", type=int, help="decode slots (batch size)")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--api-key", default=os.environ.get("SPLITSERVE_API_KEY"))
    p.add_argument("--ready-timeout", type=float, default=900.0)
    add_chat_template_arg(p)


def add_chat_template_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--chat-template", metavar="FILE",
        help="a Jinja chat template that replaces the model's own (model.chat_template)",
    )  # fmt: skip


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
                "chat_template": getattr(args, "chat_template", None),
            },
            "cluster": {"mode": args.mode, "detok_workers": args.detok_workers},
            "router": {"host": args.host, "port": args.port, "api_key": args.api_key},
        },
    )


def serve(args: argparse.Namespace) -> int:
    from splitserve.launch.health import StackNotReady, health_url, wait_ready
    from splitserve.launch.processes import ProcessStack
    from splitserve.launch.supervise import StopAll, StopSignals, supervise

    config = config_from_args(args)
    stop = StopSignals().install()
    stack = ProcessStack(config)  # in threads mode one process runs every role
    stack.start()
    host, port = config.router.host, config.router.port
    print(f"splitserve: starting {config.mode} stack, model {config.model.path!r} ...", flush=True)
    try:
        try:
            if not wait_ready(health_url(config), args.ready_timeout, stack=stack, stop=stop.event):
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
    parser = argparse.ArgumentParser(prog="splitserve")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="start the whole local stack"))
    sub.add_parser("bench", help="benchmark an endpoint (splitserve bench --help)", add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the bench parses its own options
        from splitserve.bench.__main__ import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s launcher %(levelname)s: %(message)s"
    )
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
