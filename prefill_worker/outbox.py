"""Prefixes that a decode worker's socket does not take now wait here, per decode worker, in order.

ZeroMQ bounds a socket's queue in messages (message_limits.prefix_send_hwm: sized for the largest
prefix), and a burst of small prefixes fills it while the decode worker is healthy but busy in a
step. Failing the request then would fail it for the server's own back-pressure; instead the
prefix waits here and is offered again on every loop pass, behind no other: a decode worker gets
its prefixes in the order they were made. The loop also wakes when a socket can take more (wait).

What waits is bounded in bytes (header and KV frames) per decode worker: once a decode worker's
share reaches the bound, held() names it and the prefill worker runs none of its requests (they
stay queued) until the share drains below it, so a dead or stuck decode worker costs at most the
bound and one engine call's prefixes. An Abort removes a request's waiting prefix (remove): the
router ends or moves the requests of a decode worker that died, and their prefixes go with them;
so does a restarted router, for its predecessor's requests (remove_router).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from splitserve.faults import AnySender
from splitserve.protocol import GenerateRequest
from splitserve.transport import Receiver


@dataclass
class Waiting:
    request: GenerateRequest
    frames: list[Any]  # the PrefixHeader's, then one per KV array
    nbytes: int


def frame_bytes(frames: list[Any]) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def is_gone(req: GenerateRequest, gone: dict[str, int]) -> bool:
    """Whether an Abort (request id -> epoch) ends this request: its epoch, or a later one."""
    return req.request_id in gone and req.epoch <= gone[req.request_id]


class Outbox:
    def __init__(self, senders: Sequence[AnySender], max_bytes: int):
        """senders: one per decode worker, by index; max_bytes: the bound of each one's share."""
        self.senders = list(senders)
        self.max_bytes = max_bytes
        self.waiting: list[deque[Waiting]] = [deque() for _ in self.senders]
        self.bytes = [0] * len(self.senders)
        self.waited = 0  # prefixes that had to wait here, since start
        self.kv_bytes_sent = 0  # KV frames handed to the sockets, since start

    def send(self, index: int, req: GenerateRequest, frames: list[Any]) -> bool:
        """Hand a prefix's frames to decode worker `index`'s socket, or, when it takes no more
        now or earlier prefixes wait for it, keep them behind those; True when they went now."""
        queue = self.waiting[index]
        if not queue and self.senders[index].offer(frames):
            self.kv_bytes_sent += frame_bytes(frames[1:])
            return True
        nbytes = frame_bytes(frames)
        queue.append(Waiting(req, frames, nbytes))
        self.bytes[index] += nbytes
        self.waited += 1
        return False

    def flush(self) -> int:
        """Offer what waits again, oldest first, until each socket refuses; how many went."""
        went = 0
        for index, queue in enumerate(self.waiting):
            sender = self.senders[index]
            while queue and sender.offer(queue[0].frames):
                sent = queue.popleft()
                self.bytes[index] -= sent.nbytes
                self.kv_bytes_sent += frame_bytes(sent.frames[1:])
                went += 1
        return went

    def held(self) -> set[int]:
        """The decode workers whose share is at its bound: their requests wait unprefilled."""
        return {i for i, n in enumerate(self.bytes) if n and n >= self.max_bytes}

    def remove(self, gone: dict[str, int]) -> int:
        """Drop the waiting prefixes of requests that are gone (an Abort: request id -> the
        epoch it ends, and every earlier one); how many."""
        return self._drop([w for q in self.waiting for w in q if is_gone(w.request, gone)])

    def remove_router(self, incarnation: int) -> int:
        """Drop the waiting prefixes of the requests of routers older than `incarnation` (a
        restarted router's predecessor: their clients are gone); how many."""
        return self._drop([
            w for q in self.waiting for w in q if w.request.router_incarnation < incarnation
        ])  # fmt: skip

    def _drop(self, dropped: list[Waiting]) -> int:
        if dropped:
            ids = {id(w) for w in dropped}
            for index, queue in enumerate(self.waiting):
                keep = deque(w for w in queue if id(w) not in ids)
                self.waiting[index] = keep
                self.bytes[index] = sum(w.nbytes for w in keep)
        return len(dropped)

    def counts(self) -> list[int]:
        """The prefixes waiting for each decode worker, by index."""
        return [len(queue) for queue in self.waiting]

    def empty(self) -> bool:
        return not any(self.waiting)

    def wait(self, receiver: Receiver, timeout_ms: int) -> None:
        """Block until a message comes to `receiver`, a socket with prefixes waiting for it has
        room, or timeout_ms pass."""
        poller = zmq.Poller()
        poller.register(receiver.socket, zmq.POLLIN)
        for index, queue in enumerate(self.waiting):
            if queue:  # only a plain Sender refuses a prefix: a socket of its own
                poller.register(self.senders[index].socket, zmq.POLLOUT)
        poller.poll(timeout_ms)
