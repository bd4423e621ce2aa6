"""Moving a request off a worker that died, so that its client sees a pause and nothing else.

The router holds all it needs: the request as it was sent, every token the client has had (n of
them) and the length of the text sent. A move bumps the request's placement epoch; every worker
and the router drop messages of older epochs, so nothing a dead (or frozen, then woken) worker
still sends can reach the client twice.

- Its detok worker died and it has tokens (its decode worker holds it, its prefill of this epoch
  done): only the stream moves.
  The ring picks another detok worker, which gets ResumeStream (the tokens so far: it rebuilds the
  text state, emitting nothing) and the decode worker gets Repin (send the tokens from position n
  on, and later ones, there).
- Otherwise (its prefill or decode worker died, or no token has reached the client yet): it is
  placed again and prefilled again, with the n tokens appended to its prompt and sampling at
  output position n with the same seed, so greedy and seeded outputs go on as they would have
  (where prefill and decode round alike); the detok worker gets ResumeStream first when n > 0.
- Past max_migrations moves, or after waiting migration_timeout_s for a live worker of a role it
  needs, the request ends with an error that says so. The limit stops a request that keeps
  killing its workers; a move off a worker that was stopping on purpose (it drained, or the
  operator took it out of the pool) is the operator's doing and does not count: a pool restarted
  as a group (supervisord changing numprocs) may move a stream once per worker.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from router.decisions import Decision, End, Forget, Moved, Prefill, Send
from router.placement import NoLiveWorker, Placement, Stamp
from router.request_table import RequestTable
from router.requests import RequestHandle
from router.workers import WorkerState
from splitserve.config import RouterConfig
from splitserve.protocol import FinishReason, GenerateRequest, Repin, ResumeStream

log = logging.getLogger(__name__)


class Migrator:
    """Decides every move: each method changes the placement and the handles it moves and
    returns what the router core must do for them (router/decisions.py), in order."""

    def __init__(self, config: RouterConfig, requests: RequestTable, placement: Placement):
        self.config = config
        self.requests = requests
        self.placement = placement
        self.waiting: dict[str, RequestHandle] = {}  # moves that wait for a live worker

    def worker_lost(self, w: WorkerState) -> list[Decision]:
        """Move every request that depended on worker w."""
        self.placement.worker_lost(w.role, w.index)
        self.placement.refresh()  # the ring without w, if w is gone
        out: list[Decision] = []
        for handle in self.requests.handles():
            stamp = handle.stamp
            if w.role == "detok":
                hit = stamp.detok == w.index
            elif w.role == "prefill":  # its prefill (a resumed request's too) is still there
                hit = stamp.prefill == w.index and (
                    not handle.completion_tokens or handle.prefill_pending
                )
            else:
                hit = stamp.decode == w.index
            if hit:
                out += self.move(handle, w.role, f"{w.role} worker {w.index} died", stopping(w))
        return out

    def move(
        self, handle: RequestHandle, lost: str, reason: str, planned: bool = False
    ) -> list[Decision]:
        """planned: off a worker stopping on purpose; not counted against max_migrations."""
        if handle.result is not None:
            return []
        if not planned and handle.unplanned_moves >= self.config.max_migrations:
            # off its workers now, as its end will have it: the next moves are placed without it
            self.placement.release(handle)
            return [End(handle, FinishReason.ERROR, f"{reason}; the request was moved"
                        f" {handle.unplanned_moves} times already")]  # fmt: skip
        old = handle.stamp
        handle.migrations += 1
        handle.unplanned_moves += 0 if planned else 1
        handle.last_progress = time.monotonic()  # the stall clock starts again after a move
        out: list[Decision] = [Moved(lost)]
        # A resumed request whose prefill is still running is placed anew: that prefill sends
        # its first token to the detok worker it was stamped with, which a Repin to the decode
        # worker does not redirect (the new detok worker then waited for it forever)
        stream_only = handle.completion_tokens and handle.placed and not handle.prefill_pending
        if lost == "detok" and stream_only:
            # the decode worker keeps it; the old detok worker (if it lives on) forgets it
            out.append(Forget(handle.request_id, old, ("detok",)))
            out += self.move_stream(handle, old)
        else:
            out.append(Forget(handle.request_id, old))
            self.placement.release(handle)
            out += self.replace(handle, old.epoch + 1, reason)
        return out

    def move_stream(self, handle: RequestHandle, old: Stamp) -> list[Decision]:
        """A new detok worker takes the stream over; the decode worker follows it there."""
        try:
            detok = self.placement.detok_for(handle.request_id)
        except NoLiveWorker:  # no detok worker at all: it waits, and is prefilled again then
            self.placement.release(handle)
            self.wait(handle, old.epoch + 1)
            return [Forget(handle.request_id, old, ("prefill", "decode"))]
        stamp = dataclasses.replace(old, epoch=old.epoch + 1, detok=detok)
        handle.stamp = stamp
        n = handle.completion_tokens
        log.info("%s: stream moved to detok %d (epoch %d, from token %d)", handle.request_id,
                 detok, stamp.epoch, n)  # fmt: skip
        return [
            Send("detok", detok, self.resume_message(handle)),
            Send("decode", stamp.decode, Repin([handle.request_id], [stamp.epoch], [detok], [n])),
        ]

    def replace(self, handle: RequestHandle, epoch: int, reason: str) -> list[Decision]:
        """Place the request anew and prefill it again from what the client has had."""
        message = handle.message
        try:
            self.placement.place(handle, epoch, [*message.prompt, *handle.token_ids])
        except NoLiveWorker:
            self.wait(handle, epoch)
            return []
        stamp = handle.stamp
        # sent to a prefill worker again: the stall clock starts here (not at its last token,
        # before a wait for a live worker), and its prefill queue is no stall (router/liveness.py)
        handle.last_progress = time.monotonic()
        handle.prefill_from = handle.completion_tokens
        handle.waiting_since = None
        handle.prefill_cleared_at = None
        self.waiting.pop(handle.request_id, None)
        n = handle.completion_tokens
        out: list[Decision] = [Send("detok", stamp.detok, self.resume_message(handle))] if n else []
        resent = dataclasses.replace(
            message, epoch=epoch, decode_index=stamp.decode, detok_index=stamp.detok,
            prompt=[*message.prompt, *handle.token_ids], start_seq=n,
        )  # fmt: skip
        out.append(Prefill(handle, stamp.prefill, resent))
        log.info("%s: moved (%s) to prefill %d, decode %d, detok %d at epoch %d from token %d",
                 handle.request_id, reason, stamp.prefill, stamp.decode, stamp.detok, epoch,
                 n)  # fmt: skip
        return out

    def wait(self, handle: RequestHandle, epoch: int) -> None:
        """No live worker can take it now: it waits (its stamp's epoch moves on, so the old
        workers' late output is dropped) until retry() finds one, or times out."""
        handle.stamp = dataclasses.replace(handle.stamp, epoch=epoch)
        if handle.waiting_since is None:
            handle.waiting_since = time.monotonic()
        self.waiting[handle.request_id] = handle

    def retry(self) -> list[Decision]:
        """Workers changed: place the requests that wait, or end those that waited too long."""
        now = time.monotonic()
        out: list[Decision] = []
        for rid, handle in list(self.waiting.items()):
            if handle.result is not None:
                del self.waiting[rid]
            elif now - handle.waiting_since > self.config.migration_timeout_s:
                del self.waiting[rid]
                out.append(End(handle, FinishReason.ERROR,
                               f"no live worker took the request over in "
                               f"{self.config.migration_timeout_s:.0f} s"))  # fmt: skip
            else:
                out += self.replace(handle, handle.stamp.epoch, "waited for a live worker")
        return out

    def resume_message(self, handle: RequestHandle) -> ResumeStream:
        message: GenerateRequest = handle.message
        stamp = handle.stamp
        return ResumeStream(
            handle.request_id, stamp.epoch, stamp.decode, message.detok, message.logprobs,
            list(handle.token_ids), handle.text_chars, message.router_incarnation,
        )  # fmt: skip


def stopping(w: WorkerState) -> bool:
    """The worker was stopping on purpose when last heard of: draining, or out of the pool."""
    return w.removed or bool(w.heartbeat is not None and w.heartbeat.draining)
