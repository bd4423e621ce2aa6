"""The worker shell: what every role shares.

It owns the role's receiver and its link to the router, the senders the role connects (each
wrapped by the test-only fault injection of splitserve.faults, which the shell releases once per
loop pass), the engine factory, the message dispatch (a table from message type to handler that
each role fills; other types are counted as malformed), failing requests, Ready, the heartbeat
thread and the drain on stop.

A role subclasses WorkerLoop and provides setup() (its state, senders and self.handlers),
warmup(), loop_once(), load() and idle(). The same class runs as an OS process
(python -m <role>) or as a thread (threads mode); only the zmq context, the stop event and the
environment come from outside.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from splitserve.config import ClusterConfig
from splitserve.endpoints import parse_endpoint
from splitserve.engine import build_engine
from splitserve.engine.interface import Engine
from splitserve.faults import AnySender, FaultInjector
from splitserve.message_limits import max_message_bytes
from splitserve.procutil import freeze_startup_objects
from splitserve.progress import ProgressRecord, progress_path
from splitserve.protocol import (
    INCARNATION_CHARS,
    PROTOCOL_VERSION,
    DecodeLoad,
    DetokLoad,
    DetokPool,
    Heartbeat,
    PrefillLoad,
    Ready,
    RequestFailed,
    RouterHello,
    TransportCounters,
    WorkerInfo,
)
from splitserve.run_dirs import ensure_private_dir
from splitserve.security import curve_client, curve_server, sent_by
from splitserve.startup_log import StartupLog
from splitserve.tokenizer_path import engine_vocab_size
from splitserve.transport import SEND_HWM, Receiver, Sender

RoleLoad = PrefillLoad | DecodeLoad | DetokLoad
MAX_DETOK_POOL = 256  # as the router's (router/workers.py): a socket each
Handler = Callable[[Any, list[Any]], None]  # (message, its extra frames: KV arrays or none)

log = logging.getLogger(__name__)


def pool_problem(endpoints: list[str]) -> str | None:
    """Why a DetokPool's endpoints cannot be connected to, or None."""
    if len(endpoints) > MAX_DETOK_POOL:
        return f"{len(endpoints)} detok workers, at most {MAX_DETOK_POOL}"
    for k, endpoint in enumerate(endpoints):
        if endpoint:
            try:
                parse_endpoint(endpoint, f"detok {k}")
            except ValueError as exc:
                return str(exc)
    return None


class WorkerLoop:
    role = "worker"
    engine: Engine | None = None  # the prefill and decode roles' (setup: make_engine)
    _progress: ProgressRecord | None = None  # written by the heartbeat thread (open_progress)

    def __init__(
        self,
        config: ClusterConfig,
        index: int,
        ctx: zmq.Context,
        stop: threading.Event,
        environ: dict[str, str],
    ):
        self.config = config
        self.index = index
        self.ctx = ctx
        self.stop = stop
        self.counters = TransportCounters()
        self.pid = os.getpid()
        # this run of the worker, in its Ready and every heartbeat (see protocol.Ready)
        self.incarnation = secrets.token_hex(INCARNATION_CHARS // 2)
        self.faults = FaultInjector.from_env(environ)
        self._senders: list[AnySender] = []
        self.endpoint = config.endpoint_of(self.role, index)
        if config.run_dir:
            ensure_private_dir(config.run_dir)
        self.router = self.connect(config.addresses.router, f"{self.role}_to_router")
        # message type -> handler; each role fills it with the messages it takes
        self.handlers: dict[type, Handler] = {RouterHello: self.on_router_hello}
        # the incarnation of the router this worker serves (protocol.RouterHello; 0: none yet)
        self.router_incarnation = 0
        self._next_heartbeat = 0.0
        self._drain_deadline: float | None = None
        self._snapshot: tuple[float, RoleLoad | None] = (0.0, None)
        # what the start-up is doing, logged as it goes, until Ready (splitserve/startup_log.py)
        self.startup = StartupLog(f"{self.role}[{index}]", log).start()
        try:
            self.setup()
        except BaseException:
            self.startup.done()
            raise
        # after setup(): the decode worker's limit follows from its engine
        self.receiver = Receiver(
            ctx, self.endpoint, self.counters, self.receiver_limit(),
            curve_server(config.security.keys_dir, self.endpoint, self.role, index),
        )  # fmt: skip

    # ---- provided by each role ----
    def setup(self) -> None:
        """The role's own state, senders and handler table; called at the end of __init__."""

    def warmup(self) -> WorkerInfo:
        """Compile and prepare; returns facts for the Ready message."""
        return WorkerInfo()

    def loop_once(self) -> None:
        raise NotImplementedError

    def load(self) -> RoleLoad:
        """This role's load report (its Heartbeat field of the same name)."""
        raise NotImplementedError

    def idle(self) -> bool:
        """Nothing in flight: a draining worker may exit."""
        return True

    def close(self) -> None:
        pass

    def end_router_requests(self, incarnation: int) -> int:
        """A router of this incarnation took over: forget every request of an older one (its
        router is gone, and with it every client connection). Returns how many were ended."""
        return 0

    # ---- shared ----
    def make_engine(self) -> Engine:
        """This role's engine, as the configuration names it (prefill and decode roles)."""
        model = self.config.model
        if self.role == "decode" and self.config.decode_slots:  # workers may differ in batch size
            model = dataclasses.replace(model, num_slots=self.config.slots_of(self.index))
        self.startup.phase(f"loading the model ({model.engine} engine, {model.path})")
        engine = build_engine(model, engine_vocab_size(model), role=self.role,
                              most_slots=self.config.router.max_running)  # fmt: skip
        if model.engine == "jax":
            self.startup.phase("compiling the warm-up programs")
        return engine

    def receiver_limit(self) -> int:
        """The largest frame this worker's receiver takes (splitserve/message_limits.py)."""
        kv = self.engine.kv_bytes_per_token if self.role == "decode" else 0
        return max_message_bytes(self.role, self.config, kv)

    def connect(
        self, endpoint: str, path: str, peer: tuple[str, int] | None = None, *,
        hwm: int = SEND_HWM,
    ) -> AnySender:  # fmt: skip
        """A sender to endpoint (the receiver of process `peer`, found from the configured
        addresses when not given), queueing up to hwm messages, counted in this worker's
        transport counters, with whatever faults the environment puts on path (see
        splitserve.faults); closed when the loop ends."""
        sender = self.faults.wrap(self.plain_sender(endpoint, self.counters, peer, hwm), path)
        self._senders.append(sender)
        return sender

    def plain_sender(
        self, endpoint: str, counters: TransportCounters, peer: tuple[str, int] | None = None,
        hwm: int = SEND_HWM,
    ) -> Sender:  # fmt: skip
        """A Sender, with CURVE when the cluster has keys and the endpoint is tcp."""
        peer = peer or self.config.process_at(endpoint)
        keys_dir = self.config.security.keys_dir
        curve = curve_client(keys_dir, endpoint, (self.role, self.index), peer) if peer else None
        if curve is None and keys_dir and endpoint.startswith("tcp://"):
            raise ValueError(f"{endpoint} is no process of the cluster file: no key to reach it")
        return Sender(self.ctx, endpoint, counters, curve, hwm)

    def detok_senders(self, path: str) -> list[AnySender | None]:
        """One sender per detok worker of the pool, indexed as the requests' detok_index is
        (None where an index left the pool); DetokPool messages keep it up to date."""
        self._detok_path = path
        self._detok_endpoints = list(self.config.addresses.detok)
        self.detoks = [self.connect(endpoint, path) for endpoint in self._detok_endpoints]
        self.handlers[DetokPool] = self.on_detok_pool
        return self.detoks

    def on_detok_pool(self, msg: DetokPool, _frames: list[Any]) -> None:
        """The detok pool grew or shrank: connect to new members, close the senders of gone ones."""
        problem = pool_problem(msg.endpoints)
        if problem is not None:  # a sender to it would raise (zmq refuses a bad endpoint)
            self.counters.malformed += 1
            log.warning("%s[%d]: DetokPool dropped: %s", self.role, self.index, problem)
            return
        for k, endpoint in enumerate(msg.endpoints):
            known = self._detok_endpoints[k] if k < len(self._detok_endpoints) else None
            if endpoint == known:
                continue
            if k >= len(self.detoks):
                self.detoks.extend([None] * (k + 1 - len(self.detoks)))
                self._detok_endpoints.extend([""] * (k + 1 - len(self._detok_endpoints)))
            old = self.detoks[k]
            if old is not None:
                self._senders.remove(old)
                old.close()
            self.detoks[k] = (
                self.connect(endpoint, self._detok_path, ("detok", k)) if endpoint else None
            )
            self._detok_endpoints[k] = endpoint
            log.info("%s[%d]: detok %d at %s", self.role, self.index, k, endpoint or "(gone)")

    def detok(self, index: int) -> AnySender | None:
        """The sender to detok worker `index`, or None if it is not in the pool."""
        return self.detoks[index] if 0 <= index < len(self.detoks) else None

    def run(self) -> None:
        """Warm up and report Ready, then loop until stopped and drained."""
        self.announce_ready()
        self._progress = self.open_progress()
        heartbeats_done = threading.Event()
        heart = threading.Thread(
            target=self._heartbeat_loop, args=(heartbeats_done,), name=f"{self.role}-heartbeat",
            daemon=True,
        )  # fmt: skip
        heart.start()
        try:
            while not self.drained():
                self.loop_once()
                self.faults.release_due()
                self.maybe_snapshot()
        finally:
            heartbeats_done.set()
            heart.join(timeout=5)
            self.shutdown()

    def announce_ready(self) -> None:
        try:
            info = dataclasses.replace(self.warmup(), endpoint=self.endpoint)
        finally:
            self.startup.done()
        if threading.current_thread() is threading.main_thread():  # this process is the role's
            freeze_startup_objects()
        self.router.send(
            Ready(self.role, self.index, self.pid, PROTOCOL_VERSION, info, self.incarnation)
        )
        log.info("%s[%d] ready (pid %d)", self.role, self.index, self.pid)
        self.take_snapshot()

    def drained(self) -> bool:
        """Stopped, and idle or out of drain time: the loop may end."""
        if not self.stop.is_set():
            return False
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.config.lifecycle.drain_timeout_s
            log.info("%s[%d] draining", self.role, self.index)
        return self.idle() or time.monotonic() > self._drain_deadline

    def shutdown(self) -> None:
        self.close()
        if self.engine is not None:  # its compiles after warm-up end with the worker
            self.engine.close()
        self.receiver.close()
        for sender in self._senders:
            sender.close()
        log.info("%s[%d] stopped", self.role, self.index)

    def receive(self, wait: bool) -> list[tuple[Any, list[Any]]]:
        """The messages waiting now; with wait, block first until one comes or a snapshot is due.
        On CURVE, a message from a process whose role does not send it is dropped and counted."""
        if wait:
            self.receiver.poll(self.poll_timeout_ms())
        out = []
        for msg, frames, peer in self.receiver.drain_from():
            if peer is None or sent_by(msg, peer):  # None: ipc or inproc, no identity to check
                out.append((msg, frames))
            else:
                self.counters.malformed += 1
                log.warning("%s[%d]: dropped a %s from %s, which does not send it", self.role,
                            self.index, type(msg).__name__, peer)  # fmt: skip
        return out

    def dispatch(self, messages: list[tuple[Any, list[Any]]]) -> None:
        """Hand each message to the handler for its type; a type this role does not take is
        counted as malformed (it travels in heartbeats) and skipped."""
        for msg, frames in messages:
            handler = self.handlers.get(type(msg))
            if handler is None:
                self.counters.malformed += 1
                log.warning("%s[%d]: unexpected %s", self.role, self.index, type(msg).__name__)
            else:
                handler(msg, frames)

    def on_router_hello(self, msg: RouterHello, _frames: list[Any]) -> None:
        self.serves_router(msg.incarnation)

    def serves_router(self, incarnation: int, from_router: bool = True) -> bool:
        """Whether a request of the router of this incarnation is served here: False for an
        older incarnation than the one this worker follows (the message is dropped). A newer one,
        in a message from the router itself, is followed from now on, and the requests of the
        older ones end (end_router_requests); in a message another worker passed on (a prefix,
        a stream's opening) it is served, and followed once the router says so: only the router
        speaks for itself."""
        if incarnation < self.router_incarnation:
            return False
        if incarnation > self.router_incarnation and from_router:
            known, self.router_incarnation = self.router_incarnation, incarnation
            ended = self.end_router_requests(incarnation)
            if known:
                log.warning("%s[%d]: the router restarted: %d request(s) of its predecessor "
                            "ended", self.role, self.index, ended)  # fmt: skip
        return True

    def fail(self, request_ids: list[str], epochs: list[int], message: str) -> None:
        """End requests (at these epochs) with an error: the router tells their clients."""
        log.warning("%s[%d]: failing %s: %s", self.role, self.index, request_ids, message)
        self.router.send(RequestFailed(request_ids, epochs, self.role, message))

    def maybe_snapshot(self) -> None:
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.lifecycle.heartbeat_interval_s / 2
            self.take_snapshot()

    def take_snapshot(self) -> None:
        """The loop's load figures, taken on the loop's own thread (they are not thread-safe)."""
        self._snapshot = (time.monotonic(), self.load())

    def _heartbeat_loop(self, done: threading.Event) -> None:
        """Heartbeats go from a thread of their own, on a socket of their own, so that a long
        engine call (a big prefill, a compile) never reads as a dead worker: JAX releases the GIL
        while it computes. loop_age_s tells how long ago the loop last completed a pass."""
        sender = self.plain_sender(self.config.addresses.router, TransportCounters(), ("router", 0))
        try:
            while not done.wait(self.config.lifecycle.heartbeat_interval_s):
                taken, load = self._snapshot
                transport = dataclasses.replace(self.counters)  # a copy: the loop counts on
                beat = Heartbeat(
                    self.role, self.index, self.pid, PROTOCOL_VERSION,
                    round(time.monotonic() - taken, 3), self.stop.is_set(), transport,
                    **{self.role: load}, incarnation=self.incarnation,
                )  # fmt: skip
                sender.send(beat)
                if self._progress is not None:  # what the launcher judges this process by
                    self._progress.write(time.monotonic(), taken)
        finally:
            sender.close()
            if self._progress is not None:
                self._progress.close()

    def open_progress(self) -> ProgressRecord | None:
        """This process's progress record in the run directory (splitserve/progress.py), which
        its launcher reads to replace it once it stops; None for a worker thread (threads mode:
        the process is not this worker's alone) or without a run directory."""
        if not self.config.run_dir or threading.current_thread() is not threading.main_thread():
            return None
        return ProgressRecord(progress_path(self.config.run_dir, self.role, self.index))

    def poll_timeout_ms(self) -> int:
        """Block at most until the next snapshot is due."""
        wait = self._next_heartbeat - time.monotonic()
        return max(0, min(50, int(wait * 1000)))
