"""The prefill worker: runs each prompt once, samples its first token, and hands the request on.

A request's path through this process:
 1. A GenerateRequest arrives from the router, stamped with its decode worker, its detok worker and
    its placement epoch; it waits in a bounded queue (an Abort of its epoch removes it, and so
    does a RouterHello of a newer router incarnation: its router is gone). Its send sequence
    number is echoed in the load report (last_seq; a Fence carries one too): with
    an empty queue it shows the router that the request has left this worker.
 2. The prompt's longest run of blocks in the prefix cache is looked up (prefill_worker/
    prefix_reuse.py). engine.prefill() (or prefill_cached(), given that run) computes the rest,
    padded to a compiled length bucket, and samples the token at output position start_seq (0;
    or n for a request resumed after its decode worker died, whose prompt then ends with its
    first n output tokens). A plain request the cache cannot help runs in one
    engine.prefill_batch() call with the plain requests queued behind it, up to
    [model] prefill_batch_tokens (prefill_worker/batching.py); each gets what it would alone.
    From the call's start until the queue is empty, this worker's mark in the run directory
    tells the host's decode workers to leave it its cores (splitserve/core_share.py).
 3. The finish rules are checked for that token (max_tokens reached, eos).
 4. The token goes straight to the stamped detok worker as a TokenBatch; at position 0 it opens the
    stream (detokenization parameters ride along; a resumed stream was reopened by the router). It
    leaves first, because it is what the client is waiting for: the first tokens of a whole call
    go before any of its prefixes.
 5. Unless the request already finished, its prefix (the KV cache of the true prompt length as
    extra frames, plus that token) goes to the stamped decode worker. When that worker's socket
    takes no more now (its queue is counted in messages, sized for the largest prefix: a burst
    of small ones fills it while the decode worker is busy in a step), the prefix waits in this
    worker's outbox (prefill_worker/outbox.py) behind that decode worker's earlier ones, offered
    again on every loop pass; nothing is failed for the server's own back-pressure. While a
    decode worker's waiting prefixes are over their byte bound, the requests stamped for it stay
    queued, unprefilled, and the others go ahead; an Abort removes a waiting prefix as it does a
    queued request (the router moves or ends the requests of a decode worker that died). The
    load report counts the prefixes waiting for each decode worker (router/liveness.py). Should
    the detok worker end the stream on a stop string before the prefix arrives, its Finish
    leaves a tombstone at the decode worker, which then drops the prefix.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from prefill_worker.batching import take_batch
from prefill_worker.first_token import FirstToken
from prefill_worker.outbox import Outbox, is_gone
from prefill_worker.prefix_reuse import Hit, PrefixReuse
from splitserve import protocol
from splitserve.core_share import open_marks
from splitserve.engine.interface import Prefix
from splitserve.grammar import vocabulary
from splitserve.message_limits import PREFIX_OUTBOX_BYTES, prefix_send_hwm
from splitserve.protocol import (
    Abort,
    Fence,
    GenerateRequest,
    OpenStream,
    PrefillLoad,
    PrefixHeader,
    Source,
    TokenBatch,
    TokenFinish,
    WorkerInfo,
)
from splitserve.stats import Histogram
from splitserve.stopping import token_finish
from splitserve.worker import WorkerLoop

log = logging.getLogger(__name__)


class PrefillWorker(WorkerLoop):
    role = "prefill"

    def setup(self) -> None:
        config = self.config
        self.engine = self.make_engine()
        self.first = FirstToken(
            self.engine, vocabulary.for_model(config.model, self.engine.vocab_size)
        )
        self.reuse = PrefixReuse(self.engine, config.model)
        # a short queue per decode worker (message_limits.prefix_send_hwm), and an outbox
        # bounded in bytes behind it: prefixes for a dead or stuck one must not pile up here
        # until this process runs out of memory, nor be dropped while it is only busy
        hwm = self.faults.bound("prefill_to_decode_hwm",
                                prefix_send_hwm(config, self.engine.kv_bytes_per_token))
        self.decodes = [
            self.connect(endpoint, "prefill_to_decode", hwm=hwm)
            for endpoint in config.addresses.decode
        ]
        self.outbox = Outbox(
            self.decodes, self.faults.bound("prefill_to_decode_outbox_bytes", PREFIX_OUTBOX_BYTES)
        )
        self.detok_senders("prefill_to_detok")
        # whether this worker runs prompts, for the host's decode workers (core_share.py)
        self.marks = open_marks(config)
        self.running(False)  # a mark a dead predecessor left
        self.queue: deque[GenerateRequest] = deque()
        self.max_queue = config.router.max_running + config.router.max_queued
        self.batch_tokens = config.model.prefill_batch_tokens
        self.prefill_time = Histogram()
        self.prefills = 0
        self.batched_calls = 0  # engine calls of more than one prompt
        self.last_seq = 0  # of the last GenerateRequest or Fence received (router/liveness.py)
        self.handlers.update(
            {GenerateRequest: self.on_generate, Abort: self.on_abort, Fence: self.on_fence}
        )

    def warmup(self) -> WorkerInfo:
        # this role's side; what may compile after Ready waits for the worker to be idle
        self.engine.warmup(decode=False, progress=self.startup.compiled, quiet=self.idle)
        return WorkerInfo(max_seq_len=self.engine.max_seq_len, vocab_size=self.engine.vocab_size)

    def loop_once(self) -> None:
        ready = self.has_ready()
        if ready or self.outbox.empty():
            messages = self.receive(wait=not ready)
        else:  # only prefixes wait: for a message, or for room in a decode worker's socket
            self.outbox.wait(self.receiver, self.poll_timeout_ms())
            messages = self.receive(wait=False)
        self.dispatch(messages)
        self.outbox.flush()
        batch = self.next_batch()
        if batch:
            self.running(True)
            if len(batch) == 1:
                self.prefill(batch[0])
            else:
                self.prefill_many(batch)
        # marked from a call's start until a pass finds nothing to run (never while it waits,
        # nor while what it holds waits for a decode worker: that one needs the cores)
        self.running(self.has_ready())

    def has_ready(self) -> bool:
        """A queued request may run now: its decode worker's outbox share is under its bound."""
        held = self.outbox.held()
        if not held:
            return bool(self.queue)
        return any(r.decode_index not in held for r in self.queue)

    def next_batch(self) -> list[GenerateRequest]:
        """The requests of the next engine call (batching.py), taken from the queue; those for
        a decode worker whose outbox share is at its bound stay queued, in order."""
        held = self.outbox.held()
        if not held:
            return self.take(self.queue) if self.queue else []
        ready = deque(r for r in self.queue if r.decode_index not in held)
        if not ready:
            return []
        batch = self.take(ready)
        taken = {id(r) for r in batch}
        self.queue = deque(r for r in self.queue if id(r) not in taken)
        return batch

    def take(self, queue: deque[GenerateRequest]) -> list[GenerateRequest]:
        return take_batch(queue, self.batch_tokens, self.reuse.first_block, self.reuse.would_hit)

    def running(self, busy: bool) -> None:
        if self.marks is not None:
            self.marks.mark(self.index, busy)

    def close(self) -> None:
        self.running(False)

    # ---- messages ----
    def on_generate(self, req: GenerateRequest, _frames: list[Any]) -> None:
        self.last_seq = req.seq
        if not self.serves_router(req.router_incarnation):
            return  # from a router that was restarted since: no client waits for it
        if len(self.queue) >= self.max_queue:
            self.fail([req.request_id], [req.epoch], "prefill worker overloaded: queue full")
        else:
            self.queue.append(req)

    def on_abort(self, msg: Abort, _frames: list[Any]) -> None:
        gone = dict(zip(msg.request_ids, msg.epochs, strict=False))
        self.queue = deque(r for r in self.queue if not is_gone(r, gone))
        self.outbox.remove(gone)

    def end_router_requests(self, incarnation: int) -> int:
        """Drop the queued requests, and the waiting prefixes, of older routers."""
        kept = deque(r for r in self.queue if r.router_incarnation >= incarnation)
        ended, self.queue = len(self.queue) - len(kept), kept
        return ended + self.outbox.remove_router(incarnation)

    def on_fence(self, msg: Fence, _frames: list[Any]) -> None:
        self.last_seq = msg.seq

    # ---- the prefill ----
    def prefill(self, req: GenerateRequest) -> None:
        """Run one prompt: its first token goes to the detok worker, then its prefix to decode."""
        problem = self.invalid(req)
        if problem:
            self.fail([req.request_id], [req.epoch], problem)
            return
        start = time.perf_counter()
        hit = self.reuse.lookup(req)
        try:
            prefix = self.first.prefill(req, hit.kv)
        except ValueError as exc:  # a request the engine cannot run (too long, bad params)
            self.fail([req.request_id], [req.epoch], f"prefill failed: {exc}")
            return
        self.hand_on([req], [prefix], [hit], time.perf_counter() - start)

    def prefill_many(self, batch: list[GenerateRequest]) -> None:
        """Plain requests the prefix cache holds nothing of, in one engine call; each is handed
        on as if it had run alone."""
        ok = []
        for req in batch:
            problem = self.invalid(req)
            if problem:
                self.fail([req.request_id], [req.epoch], problem)
            else:
                ok.append(req)
        if len(ok) < 2:
            for req in ok:
                self.prefill(req)
            return
        start = time.perf_counter()
        try:
            prefixes = self.engine.prefill_batch(
                [r.prompt for r in ok], [r.sampling for r in ok], [r.start_seq for r in ok]
            )
        except ValueError:  # some prompt the engine cannot run: alone, only that one fails
            for req in ok:
                self.prefill(req)
            return
        took = time.perf_counter() - start
        self.batched_calls += 1
        # take_batch made sure none is cached: the lookups only count them in the cache's figures
        self.hand_on(ok, prefixes, [self.reuse.lookup(req) for req in ok], took)

    def hand_on(
        self, reqs: list[GenerateRequest], prefixes: list[Prefix], hits: list[Hit], took: float
    ) -> None:
        """First tokens to their detok workers, then the unfinished prefixes to decode, then
        the bookkeeping (nothing of it delays a first token)."""
        finishes = [
            token_finish(req.stop, prefix.first_token, req.start_seq + 1, prefix.length + 1,
                         self.engine.max_seq_len)  # fmt: skip
            for req, prefix in zip(reqs, prefixes, strict=True)
        ]
        for req, prefix, finish in zip(reqs, prefixes, finishes, strict=True):
            self.prefills += 1  # numbers this first token's TokenBatch
            self.send_first_token(req, prefix, finish, prefix.cached_tokens)
        for req, prefix, finish in zip(reqs, prefixes, finishes, strict=True):
            if finish == TokenFinish.NONE:
                self.send_prefix(req, prefix)
        # each prompt's share of the call: the router's admission counts prefills as run one
        # after another (queued prompts x the median), which a call of n prompts does in `took`
        share = took / len(reqs)
        for req, prefix, hit in zip(reqs, prefixes, hits, strict=True):
            self.reuse.store(req, prefix, hit)
            self.prefill_time.observe(share)
            log.info("%s prefilled: %d tokens (%d cached) in %.1f ms (%d in the call), decode %d, "
                     "detok %d", req.request_id, prefix.length, prefix.cached_tokens, took * 1e3,
                     len(reqs), req.decode_index, req.detok_index)  # fmt: skip

    def invalid(self, req: GenerateRequest) -> str | None:
        """Why this request cannot be prefilled here, if it cannot."""
        if self.detok(req.detok_index) is None:
            return f"detok index {req.detok_index} is not in the pool"
        if not 0 <= req.decode_index < len(self.decodes):
            return f"decode index {req.decode_index} out of range"
        if not req.prompt or any(not 0 <= t < self.engine.vocab_size for t in req.prompt):
            return "prompt token ids must be non-empty and within the vocabulary"
        if req.start_seq < 0:
            return "start_seq must be >= 0"
        return self.first.refusal(req)

    def send_first_token(
        self, req: GenerateRequest, prefix: Prefix, finish: TokenFinish, cached: int
    ) -> None:
        """The sampled token to the stamped detok worker; at position 0 it opens the stream
        (with the count of prompt tokens the prefix cache held: the client's cached_tokens)."""
        rid = req.request_id
        opens = []
        if req.start_seq == 0:
            opens.append(OpenStream(rid, req.epoch, req.decode_index, req.detok, req.logprobs,
                                    self.first.prompt_scores(prefix), cached,
                                    req.router_incarnation))  # fmt: skip
        top = self.first.alternatives(prefix)
        first = TokenBatch(
            Source.PREFILL, self.prefills, [rid], [req.epoch], [req.start_seq],
            [prefix.first_token], [prefix.first_logprob], [finish], opens,
            [top[0]] if top else [], [top[1]] if top else [],
        )  # fmt: skip
        self.detok(req.detok_index).send(first)

    def send_prefix(self, req: GenerateRequest, prefix: Prefix) -> None:
        """The KV cache (as extra frames) and the first token to the stamped decode worker."""
        header = PrefixHeader(
            req.request_id,
            req.epoch,
            req.detok_index,
            prefix.length,
            req.start_seq,
            prefix.first_token,
            prefix.first_logprob,
            req.sampling,
            req.stop,
            protocol.kv_meta(prefix.kv),
            req.controls,
            req.grammar,
            self.first.context(req),
            *(self.first.alternatives(prefix) or ([], [])),
            req.router_incarnation,
        )
        if not self.outbox.send(req.decode_index, req, protocol.encode(header, prefix.kv)):
            log.info("%s: prefix waits for decode worker %d (its socket takes no more now)",
                     req.request_id, req.decode_index)  # fmt: skip

    # ---- lifecycle ----
    def load(self) -> PrefillLoad:
        return PrefillLoad(
            queue=len(self.queue),
            queued_tokens=sum(len(r.prompt) for r in self.queue),
            prefills=self.prefills,
            kv_bytes_sent=self.outbox.kv_bytes_sent,
            prefill_time=self.prefill_time.snapshot(),
            last_seq=self.last_seq,
            prefix_compiling=self.engine.continuations_pending,
            batched_calls=self.batched_calls,
            outbox=self.outbox.counts(),
            outbox_waited=self.outbox.waited,
            **self.reuse.figures(),
        )

    def idle(self) -> bool:
        return not self.queue and self.outbox.empty()
