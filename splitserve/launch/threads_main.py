"""Threads mode's one process: `python -m splitserve.launch.threads_main --config FILE`.

The router process of processes mode (router/__main__.py, the same options, logging, signals
and exit codes), with every worker role beside it as a thread (ThreadStack) over inproc sockets
of the zmq context the router core shares. A request's path through it:
 1. The router (this process's event loop) takes the HTTP request, tokenizes and admits it, and
    sends it to the prefill worker thread over inproc.
 2. The prefill worker thread runs the prompt; prefix to the decode thread, token 0 to detok k.
 3. The decode worker thread steps every live slot; tokens to their detok worker threads.
 4. Detok worker thread k turns tokens into text deltas for the router.
 5. The router streams them to the client. On SIGTERM it drains, then the threads stop.
"""

from __future__ import annotations

import sys

from router.__main__ import main as router_main
from router.__main__ import serve as serve_router
from splitserve.config import ClusterConfig
from splitserve.launch.threads import ThreadStack
from splitserve.tokenizers import Tokenizer

WORKER_STOP_TIMEOUT_S = 10.0


async def serve_with_worker_threads(config: ClusterConfig, tokenizer: Tokenizer) -> None:
    stack = ThreadStack(config).start()
    try:
        await serve_router(config, tokenizer, ctx=stack.ctx)
    finally:
        stack.stop(timeout_s=WORKER_STOP_TIMEOUT_S)


def main(argv: list[str] | None = None) -> int:
    return router_main(argv, serve_fn=serve_with_worker_threads)


if __name__ == "__main__":
    sys.exit(main())
