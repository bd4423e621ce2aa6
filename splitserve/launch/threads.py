"""The worker roles as threads of this process, over inproc sockets of one shared zmq context:
the JetStream-style baseline the benchmarks compare processes mode against.

The router core runs on the caller's event loop with the same context (RouterCore(ctx=...));
threads_main.py composes the two into the one process of threads mode.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import zmq

from splitserve.config import ClusterConfig
from splitserve.launch.roles import WORKER_ROLES, role_instances

log = logging.getLogger(__name__)

# A worker builds a request's grammar matcher on its own thread, and the grammar engine recurses
# in native code along the grammar's chains. The router accepts only grammars that compiled
# on a quarter of this (router/contained/child.py); without it a thread's stack would follow
# the process's stack limit (2 MiB where that is unlimited).
WORKER_STACK_BYTES = 8 << 20


class ThreadStack:
    """Use as a context manager; a worker thread's failure is logged and kept in `errors`."""

    def __init__(self, config: ClusterConfig, environ: dict[str, str] | None = None):
        from decode_worker.worker import DecodeWorker
        from detok_worker.worker import DetokWorker
        from prefill_worker.worker import PrefillWorker

        self.config = config
        self.environ = dict(os.environ if environ is None else environ)
        self.ctx = zmq.Context()
        self.stop_event = threading.Event()
        self.classes = {"prefill": PrefillWorker, "decode": DecodeWorker, "detok": DetokWorker}
        self.threads: list[threading.Thread] = []
        self.workers: list = []
        self.errors: list[BaseException] = []

    def start(self) -> ThreadStack:
        # receivers bind in the constructors, before any thread connects to them
        workers = [
            self.classes[role](self.config, index, self.ctx, self.stop_event, self.environ)
            for role, index in role_instances(self.config, WORKER_ROLES)
        ]
        self.workers = workers
        previous = threading.stack_size(WORKER_STACK_BYTES)
        try:
            for w in workers:
                t = threading.Thread(
                    target=self._run, args=(w,), name=f"{w.role}-{w.index}", daemon=True
                )
                t.start()
                self.threads.append(t)
        finally:
            threading.stack_size(previous)
        return self

    def _run(self, worker) -> None:
        try:
            worker.run()
        except BaseException as exc:  # recorded and logged; the stack's owner decides
            log.exception("%s[%d] thread failed", worker.role, worker.index)
            self.errors.append(exc)

    def stop(self, timeout_s: float = 20.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for w, t in zip(self.workers, self.threads, strict=True):
            # a thread still compiling has nothing to drain and cannot be cut short: it is a
            # daemon, it ends with the process, and waiting for it would only delay the stop
            if w.startup.finished:
                t.join(max(0.1, deadline - time.monotonic()))
        self.ctx.destroy(linger=0)

    def __enter__(self) -> ThreadStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
