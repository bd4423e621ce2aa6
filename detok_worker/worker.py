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
 5. A stop string ends the stream: the decode worker is told (Finish) so that it frees the slot at
    once. Abort from the router drops the stream. Ended ids are remembered for a while so that
    tokens still in flight are dropped instead of opening new state.
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


class DetokWorker(WorkerLoop):
    role = "detok"

    def setup(self) -> None:
        config = self.config
        self.table = load_tokenizer(tokenizer_path(config.model)).token_table()
        self.decode = self.connect(config.addresses.decode, "detok_to_decode")
        self.streams: dict[str, Stream] = {}
        # tokens of streams not opened yet: rid -> (first seen, [(seq, token, logprob, finish)])
        self.early: dict[str, tuple[float, list[tuple[int, int, float, int]]]] = {}
        self.gone = Tombstones(config.lifecycle.state_ttl_s)
        self.pass_time = Histogram()
        self.tokens_done = 0
        self.batches_in = 0
        self.batches_out = 0
        self.broken_streams = 0
        self.opened: list[str] = []  # streams opened in this pass, logged once its text is out
        self.touched: dict[str, Stream] = {}  # streams that took tokens in this pass
        self.handlers = {TokenBatch: self.on_tokens, Abort: self.on_abort}

    def own_address(self) -> str:
        return self.config.addresses.detok[self.index]

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
        for rid in msg.request_ids:
            self.forget(rid)
            self.touched.pop(rid, None)

    # ---- the detok pass ----
    def absorb(self, batch: TokenBatch) -> None:
        """Open the streams the batch opens, then buffer each token in its stream."""
        touched = self.touched
        n = len(batch.request_ids)
        if not (
            len(batch.seqs) == len(batch.tokens) == len(batch.logprobs) == len(batch.finishes) == n
        ):
            self.counters.malformed += 1
            log.warning("detok[%d]: TokenBatch with lists of unequal length", self.index)
            return
        for opened in batch.opens:
            rid = opened.request_id
            if rid in self.gone or rid in self.streams:
                continue
            stream = Stream.open(rid, opened.detok, opened.logprobs, self.table)
            self.streams[rid] = stream
            self.opened.append(rid)
            _, early = self.early.pop(rid, (0.0, []))
            for entry in early:
                self.add(stream, *entry)
            touched[rid] = stream
        for rid, seq, token, logprob, finish in zip(
            batch.request_ids, batch.seqs, batch.tokens, batch.logprobs, batch.finishes, strict=True
        ):
            stream = self.streams.get(rid)
            if stream is not None:
                self.add(stream, seq, token, logprob, finish)
                touched[rid] = stream
            elif rid not in self.gone:
                self.early.setdefault(rid, (time.monotonic(), []))[1].append(
                    (seq, token, logprob, finish)
                )

    def add(self, stream: Stream, seq: int, token: int, logprob: float, finish: int) -> None:
        try:
            stream.add(seq, token, logprob, finish)
        except ValueError as exc:
            self.broken_streams += 1
            log.warning("detok[%d]: %s", self.index, exc)

    def emit(self) -> None:
        """Every touched stream's text delta to the router in one TextBatch; Finish to decode for
        streams a stop string ended."""
        deltas: list[TextDelta] = []
        stopped: list[str] = []
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
                    stopped.append(rid)
                self.forget(rid)
        if deltas:
            self.router.send(TextBatch(deltas))
            self.batches_out += 1
        if stopped:
            self.decode.send(Finish(stopped))
        for rid in self.opened:  # logged after the sends: a first token is what a client awaits
            log.info("%s stream opened", rid)
        self.opened.clear()
        self.touched.clear()

    def forget(self, rid: str) -> None:
        self.streams.pop(rid, None)
        self.early.pop(rid, None)
        self.gone.add(rid)

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
            pass_time=self.pass_time.snapshot(),
        )

    def idle(self) -> bool:
        return not self.streams
