"""A detok worker: every token of the requests pinned to it, in order, turned into text.

A request's path through this process:
 1. Sequence 0 arrives from the prefill worker in a TokenBatch that opens the stream (with the
    request's detokenization parameters); later tokens arrive from the decode worker, one
    TokenBatch per decode step. Either may come first: tokens of a stream not yet opened wait
    (for at most the state TTL).
 2. Each token is buffered under its sequence number; the stream emits strictly in order.
 3. Emitted tokens are detokenized incrementally (constant work per token) and checked for stop
    strings, holding back only text that could still start one.
 4. All text deltas of one pass go to the router as one TextBatch.
 5. A stop string ends the stream: the request's decode worker is told (Finish) so that it frees
    the slot at once. Abort from the router drops the stream. Ended ids are remembered for a
    while so that tokens still in flight are dropped instead of opening new state.
 6. When a request moves here (its detok worker, or its decode worker, died), the router's
    ResumeStream rebuilds its state from the tokens the client has had, emitting none of them,
    at the request's new placement epoch; tokens of older epochs are dropped from then on.
 7. When the router restarts (a RouterHello, or a ResumeStream, of a newer router incarnation),
    the streams of its predecessor are dropped: their clients are gone with it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from detok_worker.stream import Stream
from splitserve.protocol import (
    Abort,
    DetokLoad,
    Finish,
    OpenStream,
    ResumeStream,
    TextBatch,
    TextDelta,
    TokenBatch,
    WorkerInfo,
)
from splitserve.stats import Histogram
from splitserve.tokenizer_path import tokenizer_path
from splitserve.tokenizers import load_tokenizer
from splitserve.tombstones import Tombstones
from splitserve.worker import WorkerLoop

log = logging.getLogger(__name__)

Early = tuple[int, int, int, float, int, Any]  # (epoch, seq, token, logprob, finish, top)


class DetokWorker(WorkerLoop):
    role = "detok"

    def setup(self) -> None:
        config = self.config
        self.table = load_tokenizer(tokenizer_path(config.model)).token_table()
        self.decodes = [
            self.connect(endpoint, "detok_to_decode") for endpoint in config.addresses.decode
        ]
        self.streams: dict[str, Stream] = {}
        # tokens of streams not open here yet (at their epoch): rid -> (first seen, [Early])
        self.early: dict[str, tuple[float, list[Early]]] = {}
        self.gone = Tombstones(config.lifecycle.state_ttl_s)
        self.pass_time = Histogram()
        self.tokens_done = 0
        self.batches_in = 0
        self.batches_out = 0
        self.broken_streams = 0
        self.resumed = 0
        self.opened: list[str] = []  # streams opened in this pass, logged once its text is out
        self.touched: dict[str, Stream] = {}  # streams that took tokens in this pass
        self.handlers.update({
            TokenBatch: self.on_tokens,
            Abort: self.on_abort,
            ResumeStream: self.on_resume,
        })  # fmt: skip

    def warmup(self) -> WorkerInfo:
        return WorkerInfo(vocab_size=len(self.table.pieces))

    def loop_once(self) -> None:
        messages = self.receive(wait=True)
        if messages:
            start = time.perf_counter()
            self.dispatch(messages)
            self.emit()
            self.pass_time.observe(time.perf_counter() - start)
        self.prune()

    # ---- messages ----
    def on_tokens(self, batch: TokenBatch, _frames: list[Any]) -> None:
        self.batches_in += 1
        self.absorb(batch)

    def on_abort(self, msg: Abort, _frames: list[Any]) -> None:
        for rid, epoch in zip(msg.request_ids, msg.epochs, strict=False):
            stream = self.streams.get(rid)
            if stream is None or stream.epoch <= epoch:
                self.forget(rid, epoch)
                self.touched.pop(rid, None)

    def on_resume(self, msg: ResumeStream, _frames: list[Any]) -> None:
        """Take a request's stream over at a new epoch, from the tokens the client has had."""
        rid = msg.request_id
        current = self.streams.get(rid)
        if self.gone.covers(rid, msg.epoch) or (current and current.epoch >= msg.epoch):
            return
        if not self.serves_router(msg.router_incarnation):
            return
        stream = Stream.open(rid, msg.epoch, msg.decode_index, msg.detok, msg.logprobs, self.table)
        stream.router_incarnation = msg.router_incarnation
        emitted = stream.replay(list(msg.token_ids))
        if emitted != msg.text_chars or stream.finish_reason:
            # the client's text and its tokens disagree: carry on from the tokens, and say so
            self.broken_streams += 1
            log.warning("%s: resumed stream replays to %d characters, the client has %d", rid,
                        emitted, msg.text_chars)  # fmt: skip
        self.streams[rid] = stream
        self.resumed += 1
        self.take_early(stream)
        log.info("%s stream resumed at epoch %d from seq %d", rid, msg.epoch, stream.next_seq)

    # ---- the detok pass ----
    def absorb(self, batch: TokenBatch) -> None:
        """Open the streams the batch opens, then buffer each token in its stream."""
        n = len(batch.request_ids)
        if not (
            len(batch.seqs) == len(batch.tokens) == len(batch.logprobs) == len(batch.finishes)
            == len(batch.epochs) == n
        ):  # fmt: skip
            self.counters.malformed += 1
            log.warning("detok[%d]: TokenBatch with lists of unequal length", self.index)
            return
        for opened in batch.opens:
            self.open(opened)
        tops = zip(batch.top_ids, batch.top_logprobs, strict=True) if batch.top_ids else None
        for rid, epoch, seq, token, logprob, finish in zip(
            batch.request_ids, batch.epochs, batch.seqs, batch.tokens, batch.logprobs,
            batch.finishes, strict=True,
        ):  # fmt: skip
            top = next(tops) if tops is not None else None
            stream = self.streams.get(rid)
            if stream is not None and stream.epoch == epoch:
                self.add(stream, seq, token, logprob, finish, top)
                self.touched[rid] = stream
            elif (stream is None or epoch > stream.epoch) and not self.gone.covers(rid, epoch):
                # its stream opens (or moves here) later: the OpenStream or ResumeStream is late
                self.early.setdefault(rid, (time.monotonic(), []))[1].append(
                    (epoch, seq, token, logprob, finish, top)
                )
            # else: a token of an older epoch, from a worker the request has moved away from

    def open(self, opened: OpenStream) -> None:
        rid = opened.request_id
        current = self.streams.get(rid)
        if self.gone.covers(rid, opened.epoch) or (current and current.epoch >= opened.epoch):
            return
        if not self.serves_router(opened.router_incarnation, from_router=False):
            return
        stream = Stream.open(
            rid, opened.epoch, opened.decode_index, opened.detok, opened.logprobs, self.table
        )
        stream.prompt_logprobs = opened.prompt_logprobs
        stream.cached_tokens = opened.cached_tokens
        stream.router_incarnation = opened.router_incarnation
        self.streams[rid] = stream
        self.opened.append(rid)
        self.take_early(stream)

    def take_early(self, stream: Stream) -> None:
        """Tokens of this stream's epoch that came before it opened join it; older ones go."""
        _, early = self.early.pop(stream.request_id, (0.0, []))
        later = []
        for epoch, seq, token, logprob, finish, top in early:
            if epoch == stream.epoch:
                self.add(stream, seq, token, logprob, finish, top)
            elif epoch > stream.epoch:
                later.append((epoch, seq, token, logprob, finish, top))
        if later:
            self.early[stream.request_id] = (time.monotonic(), later)
        self.touched[stream.request_id] = stream

    def add(
        self, stream: Stream, seq: int, token: int, logprob: float, finish: int, top: Any = None
    ) -> None:
        try:
            stream.add(seq, token, logprob, finish, top)
        except ValueError as exc:
            self.broken_streams += 1
            log.warning("detok[%d]: %s", self.index, exc)

    def emit(self) -> None:
        """Every touched stream's text delta to the router in one TextBatch; Finish to the decode
        worker of each stream a stop string ended."""
        deltas: list[TextDelta] = []
        stopped: dict[int, list[Stream]] = {}
        for rid, stream in self.touched.items():
            delta = stream.advance()
            if delta is None:
                continue
            deltas.append(delta)
            self.tokens_done += len(delta.token_ids)
            if delta.finish_reason:
                log.info("%s stream ended: %s after %d tokens", rid, delta.finish_reason.api,
                         stream.emitted_tokens)  # fmt: skip
                if stream.stopped_by_string:
                    stopped.setdefault(stream.decode_index, []).append(stream)
                self.forget(rid, stream.epoch)
        if deltas:
            self.router.send(TextBatch(deltas))
            self.batches_out += 1
        for decode_index, streams in stopped.items():
            if 0 <= decode_index < len(self.decodes):
                finish = Finish([s.request_id for s in streams], [s.epoch for s in streams])
                self.decodes[decode_index].send(finish)
        for rid in self.opened:  # logged after the sends: a first token is what a client awaits
            log.info("%s stream opened", rid)
        self.opened.clear()
        self.touched.clear()

    def end_router_requests(self, incarnation: int) -> int:
        """Drop the streams of requests of older routers."""
        ended = [s for s in self.streams.values() if s.router_incarnation < incarnation]
        for stream in ended:
            self.forget(stream.request_id, stream.epoch)
            self.touched.pop(stream.request_id, None)
        return len(ended)

    def forget(self, rid: str, epoch: int) -> None:
        self.streams.pop(rid, None)
        entry = self.early.get(rid)
        if entry is not None:
            later = [e for e in entry[1] if e[0] > epoch]
            if later:
                self.early[rid] = (entry[0], later)
            else:
                del self.early[rid]
        self.gone.add(rid, epoch)

    def prune(self) -> None:
        self.gone.prune()
        if self.early:
            horizon = time.monotonic() - self.config.lifecycle.state_ttl_s
            for rid in [r for r, (t, _) in self.early.items() if t < horizon]:
                del self.early[rid]

    # ---- lifecycle ----
    def load(self) -> DetokLoad:
        return DetokLoad(
            streams=len(self.streams),
            early=len(self.early),
            tombstones=len(self.gone),
            tokens=self.tokens_done,
            batches_in=self.batches_in,
            batches_out=self.batches_out,
            broken_streams=self.broken_streams,
            resumed=self.resumed,
            pass_time=self.pass_time.snapshot(),
        )

    def idle(self) -> bool:
        return not self.streams
