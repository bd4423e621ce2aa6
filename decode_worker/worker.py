"""The decode worker: inserts prefixes into free slots and runs the batched decode loop.

A request's path through this process:
 1. A PrefixHeader (with its KV cache as extra frames) arrives from a prefill worker; the arrays
    are read-only views over the received frames, not copies.
 2. If the request was aborted or finished by a stop string (at that placement epoch or a later
    one) before its prefix arrived, the prefix is dropped (tombstones remember such ids for a
    while). If it names a detok worker this process has not yet heard of (the router's DetokPool
    that adds it can arrive after prefill's prefix), it waits for that message. Otherwise it
    waits in a bounded pending queue.
 3. Once a loop pass has handled its messages, pending prefixes take free slots of the slot table
    (lowest index first) and go into the engine (engine.insert).
 4. One engine.generate() step advances every live slot by one token; while no prefix waits, no
    live slot has logits controls or a grammar and few slots are live ([model]
    decode_steps_max_live), engine.generate_many(k) runs k steps in one dispatch ([model]
    decode_steps), so the host's work per step is paid once per k. While a prefill worker of
    this host runs prompts, the engine's kernels leave it its cores (splitserve/core_share.py).
 5. Each token is checked against the finish rules (eos / stop ids, max_tokens, context limit) and
    kept in its slot's history; a slot's tokens after its finish within a chunk are dropped.
 6. The tokens of the step (or chunk) are grouped by their stamped detok worker, in slot order,
    and sent as one TokenBatch per detok worker (only to those with tokens); sends never block.
 7. A slot is freed on a finishing token, on Abort from the router, or on Finish from the detok
    worker (stop string) - each within one step (or chunk) of the message arriving.
 8. When a request's detok worker dies, the router's Repin moves its stream: the slot's history
    from the position the client has reached is sent to the new detok worker, and later tokens
    follow it there (a Repin before its prefix, or after its request ended: repins.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from decode_worker.constrained import ConstrainedSlots
from decode_worker.prefix_check import prefix_problem
from decode_worker.repins import Repins
from decode_worker.slots import Slot, SlotTable
from decode_worker.token_batches import Batches, append, batch_for, resend
from splitserve import protocol
from splitserve.core_share import share_with_prefill
from splitserve.grammar import vocabulary
from splitserve.protocol import (
    Abort,
    DecodeLoad,
    DetokPool,
    Finish,
    PrefixHeader,
    Repin,
    TokenFinish,
    WorkerInfo,
)
from splitserve.stats import Histogram
from splitserve.tombstones import Tombstones
from splitserve.worker import WorkerLoop

log = logging.getLogger(__name__)


class DecodeWorker(WorkerLoop):
    role = "decode"

    def setup(self) -> None:
        config = self.config
        self.engine = self.make_engine()
        self.constrained = ConstrainedSlots(
            self.engine, vocabulary.for_model(config.model, self.engine.vocab_size)
        )
        self.detok_senders("decode_to_detok")
        # the cores this host's prefill workers take while they run prompts (core_share.py)
        self.marks = share_with_prefill(config, self.engine)
        self.chunk = config.model.decode_steps
        # chunks only while at most this many slots are live (0: any)
        self.chunk_live = config.model.decode_steps_max_live or self.engine.num_slots
        self.slots = SlotTable(self.engine.num_slots)
        self.pending: deque[tuple[PrefixHeader, list[Any]]] = deque()
        # the router admits at most max_running requests; the slack covers prefixes of aborted
        # requests that arrive before their Abort does (they are dropped when it comes)
        self.max_pending = 2 * config.router.max_running + 4 * self.engine.num_slots
        self.gone = Tombstones(config.lifecycle.state_ttl_s)
        self.repins = Repins()  # kept for the state TTL
        # prefixes that name a detok index this worker's pool lacks (when, header, frames). The
        # router sends DetokPool before it places a request on a new member, but that message
        # comes over the router's connection and the prefix over prefill's, so the prefix can
        # come first. Held until a DetokPool names the index; failed after the state TTL.
        self.awaiting_pool: deque[tuple[float, PrefixHeader, list[Any]]] = deque()
        self.step_time = Histogram()
        self.step_gap = Histogram()  # start-to-start time of consecutive busy steps
        self.insert_time = Histogram()
        self.steps = 0
        self.chunks = 0  # dispatches of several steps
        self.batches_sent = 0  # TokenBatches to detok workers: at most one per detok per step
        self.tokens_sent = 0
        self.kv_bytes_received = 0
        self._last_step_start: float | None = None
        self._last_chunk = 1  # steps of the last dispatch: the gap is counted per step
        self.failed_inserts = 0
        self.handlers.update({
            PrefixHeader: self.on_prefix,
            Abort: self.on_release,
            Finish: self.on_release,
            Repin: self.on_repin,
        })  # fmt: skip

    def warmup(self) -> WorkerInfo:
        # this role's side; what may compile after Ready waits for the worker to be idle
        self.engine.warmup(prefill=False, progress=self.startup.compiled, quiet=self.idle)
        return WorkerInfo(max_seq_len=self.engine.max_seq_len, num_slots=self.engine.num_slots)

    def loop_once(self) -> None:
        idle = self.idle()
        if idle:
            self._last_step_start = None  # an idle pause is not a stall
        self.dispatch(self.receive(wait=idle))
        self.insert_pending()
        if self.slots:
            self.step()
        self.prune()

    # ---- messages ----
    def on_prefix(self, header: PrefixHeader, frames: list[Any]) -> None:
        """A prefix from prefill (its KV arrays in frames) waits for a free slot."""
        rid = header.request_id
        if self.gone.covers(rid, header.epoch):
            return
        if not self.serves_router(header.router_incarnation, from_router=False):
            return
        held = self.slots.get(rid)
        if held is not None or any(h.request_id == rid for h in self.queued_headers()):
            if held is None or held.epoch >= header.epoch:
                self.fail([rid], [header.epoch], "duplicate request id at decode")
                return
            self.release(rid, held.epoch)  # the request moved on: its older slot is stale
        if self.detok(header.detok_index) is None:
            if self.queued() >= self.max_pending:
                self.fail([rid], [header.epoch], "decode worker overloaded: pending queue full")
                return
            log.info("%s waits for detok %d to join the pool", rid, header.detok_index)
            self.awaiting_pool.append((time.monotonic(), header, frames))
            return
        problem = prefix_problem(header, frames, self.engine)
        if problem is not None:
            self.failed_inserts += 1
            self.fail([rid], [header.epoch], f"cannot insert prefix: {problem}")
            return
        refusal = self.constrained.refusal(header)
        if refusal is not None:
            self.fail([rid], [header.epoch], refusal)
            return
        if self.queued() >= self.max_pending:
            self.fail([rid], [header.epoch], "decode worker overloaded: pending queue full")
            return
        self.kv_bytes_received += sum(len(f) for f in frames)
        self.pending.append((header, frames))

    def queued_headers(self) -> Iterator[PrefixHeader]:
        """The prefixes that wait here: for a slot, or for their detok worker to be announced."""
        yield from (h for h, _ in self.pending)
        yield from (h for _, h, _ in self.awaiting_pool)

    def queued(self) -> int:
        return len(self.pending) + len(self.awaiting_pool)

    def on_release(self, msg: Abort | Finish, _frames: list[Any]) -> None:
        for rid, epoch in zip(msg.request_ids, msg.epochs, strict=False):
            self.release(rid, epoch)

    def release(self, rid: str, epoch: int) -> None:
        """Abort or stop-string finish of a request at `epoch` (or earlier): free its slot now,
        or drop its prefix when it arrives."""
        self.gone.add(rid, epoch)
        self.repins.take(rid)
        state = self.slots.get(rid)
        if state is not None and state.epoch <= epoch:
            slot = self.slots.release(rid)
            log.info("%s released from slot %d", rid, slot)
            self.free(slot)
            self.repins.ended(state)  # a stop string: the stream ended
            return
        self.repins.forget_ended(rid, epoch)
        for i, (h, _) in enumerate(self.pending):
            if h.request_id == rid and h.epoch <= epoch:
                del self.pending[i]
                return
        for i, (_, h, _) in enumerate(self.awaiting_pool):
            if h.request_id == rid and h.epoch <= epoch:
                del self.awaiting_pool[i]
                return

    def end_router_requests(self, incarnation: int) -> int:
        """Free the slots, and drop the waiting prefixes, of requests of older routers."""
        ended = [
            (state.request_id, state.epoch) for _, state in self.slots.live()
            if state.router_incarnation < incarnation
        ]  # fmt: skip
        ended += [
            (h.request_id, h.epoch) for h in self.queued_headers()
            if h.router_incarnation < incarnation
        ]  # fmt: skip
        for rid, epoch in ended:
            self.release(rid, epoch)
        return len(ended)

    def on_detok_pool(self, msg: DetokPool, frames: list[Any]) -> None:
        """The pool changed: prefixes that waited for one of its new members go on."""
        super().on_detok_pool(msg, frames)
        waiting, self.awaiting_pool = self.awaiting_pool, deque()
        for when, header, kv_frames in waiting:
            if self.detok(header.detok_index) is None:
                self.awaiting_pool.append((when, header, kv_frames))
            else:
                self.on_prefix(header, kv_frames)

    def on_repin(self, msg: Repin, _frames: list[Any]) -> None:
        """Streams moved to other detok workers: resend what those have not seen, then follow."""
        batches: Batches = {}
        for state, epoch, detok, from_seq in self.repins.found(msg, self.slots):
            self.repin(state, epoch, detok, from_seq, batches)
        self.send_batches(batches)

    def repin(
        self, state: Slot, epoch: int, detok: int, from_seq: int, batches: Batches
    ) -> Batches:
        """The stream moves to detok worker `detok` at `epoch` (if newer, and in this worker's
        pool): its tokens from output position from_seq on go there, and later ones follow."""
        if epoch <= state.epoch or self.detok(detok) is None:
            return batches
        state.epoch, state.detok_index = epoch, detok
        resend(state, from_seq, batch_for(batches, detok, self.steps))
        log.info("%s repinned to detok %d at epoch %d from seq %d", state.request_id, detok,
                 epoch, from_seq)  # fmt: skip
        return batches

    def insert_pending(self) -> None:
        while self.pending and self.slots.free_count:
            header, frames = self.pending.popleft()
            rid = header.request_id
            state = Slot(
                rid, header.epoch, header.detok_index, header.stop, header.first_seq + 1,
                header.length + 1, header.first_seq, router_incarnation=header.router_incarnation,
            )  # fmt: skip
            state.tokens.append(header.first_token)
            state.logprobs.append(header.first_logprob)
            slot = self.slots.take(state)
            start = time.perf_counter()
            try:
                kv = protocol.arrays_from_frames(header.kv_meta, frames)
                prefix = self.constrained.prefix(header, kv)
                self.constrained.insert(header, prefix, slot, state)
            except (protocol.ProtocolError, ValueError) as exc:
                self.slots.release(rid)  # the engine never took it: nothing to free there
                self.failed_inserts += 1
                self.fail([rid], [header.epoch], f"cannot insert prefix: {exc}")
                continue
            self.insert_time.observe(time.perf_counter() - start)
            log.info("%s inserted in slot %d", rid, slot)
            held = self.repins.take(rid)  # a Repin that came before its prefix
            if held is not None:
                self.send_batches(self.repin(state, *held, {}))

    # ---- the decode step ----
    def step(self) -> None:
        """Advance every live slot by one token (or a chunk of steps); send each detok worker
        its tokens of the step."""
        start = time.perf_counter()
        if self._last_step_start is not None:
            self.step_gap.observe((start - self._last_step_start) / self._last_chunk)
        self._last_step_start = start
        steps = self.chunk_steps()
        self._last_chunk = steps
        if steps > 1:
            batches = self.run_chunk(steps)
        else:
            out, broken = self.constrained.generate()
            self.steps += 1
            for slot, error in broken.items():  # a broken grammar: its token goes nowhere
                self.fail_slot(slot, error)
            batches = self.collect(out.tokens.tolist(), out.logprobs.tolist(), out)
            self.constrained.prepare()  # the next masks, while the batches go and messages come
        self.send_batches(batches)
        self.step_time.observe((time.perf_counter() - start) / steps)  # per step, as before

    def chunk_steps(self) -> int:
        """Steps for the next dispatch: the configured chunk while nothing needs a step of its
        own (a waiting prefix takes the next free slot; a mask or matcher is per step), at most
        decode_steps_max_live slots are live and every live slot has room in its context for
        the whole chunk, and some live slot may still take the whole chunk's tokens (else
        each of the chunk's last steps would be computed for nothing: a request asking for
        two tokens ran four steps); else one."""
        k = self.chunk
        if k == 1 or self.pending or self.constrained.single_steps:
            return 1
        live = [state for _, state in self.slots.live()]
        if len(live) > self.chunk_live or not self.engine.multi_step_ready(k):
            return 1  # (not ready: its program still compiles after a cold warm-up)
        if max(state.context_len for state in live) + k > self.engine.max_seq_len:
            return 1
        return k if max(state.stop.max_tokens - state.next_seq for state in live) >= k else 1

    def run_chunk(self, steps: int) -> Batches:
        """engine.generate_many(steps): every step's tokens in one batch per detok worker; a
        slot that finishes at step j is freed there, so its later tokens are never read."""
        out = self.engine.generate_many(steps)
        self.chunks += 1
        tokens, logprobs = out.tokens.tolist(), out.logprobs.tolist()
        batches: Batches = {}
        for j in range(steps):
            self.steps += 1
            self.collect(tokens[j], logprobs[j], None, batches)
        return batches

    def fail_slot(self, slot: int, error: str) -> None:
        for index, state in self.slots.live():
            if index == slot:
                self.slots.release(state.request_id)
                self.free(slot)
                self.gone.add(state.request_id, state.epoch)
                self.fail([state.request_id], [state.epoch], error)
                return

    def free(self, slot: int) -> None:
        self.constrained.free(slot)
        self.engine.free(slot)

    def collect(
        self, tokens: list[int], logprobs: list[float], out: Any = None,
        batches: Batches | None = None,
    ) -> Batches:
        """The step's tokens (indexed by slot) grouped by detok worker, in slot order within each
        batch (added to `batches` when given); a slot whose token finishes its request is
        freed."""
        batches = {} if batches is None else batches
        max_seq_len = self.engine.max_seq_len
        for slot, state in self.slots.live():
            token = tokens[slot]
            seq, finish = state.advance(token, logprobs[slot], max_seq_len)
            top = None
            if state.top_logprobs:
                top = self.constrained.alternatives(out, slot, state) or ([], [])
                state.tops.append(top)
            append(batch_for(batches, state.detok_index, self.steps), state, seq, token,
                   logprobs[slot], finish, top)  # fmt: skip
            if finish != TokenFinish.NONE:
                log.info("%s finished in slot %d after %d tokens", state.request_id, slot, seq + 1)
                state.finish = finish
                self.slots.release(state.request_id)
                self.free(slot)
                self.repins.ended(state)
        return batches

    def send_batches(self, batches: Batches) -> None:
        """One TokenBatch per detok worker with tokens in this step; sends never block. A detok
        worker that left the pool gets nothing: the router moves its streams (Repin)."""
        for detok_index, batch in batches.items():
            sender = self.detok(detok_index)
            if sender is not None:
                sender.send(batch)
        self.batches_sent += len(batches)
        self.tokens_sent += sum(len(b.tokens) for b in batches.values())

    # ---- lifecycle ----
    def prune(self) -> None:
        self.gone.prune()
        horizon = time.monotonic() - self.config.lifecycle.state_ttl_s
        while self.awaiting_pool and self.awaiting_pool[0][0] < horizon:
            _, header, _ = self.awaiting_pool.popleft()
            self.fail([header.request_id], [header.epoch],
                      f"detok index {header.detok_index} not in the pool")  # fmt: skip
        self.repins.prune(horizon)

    def load(self) -> DecodeLoad:
        return DecodeLoad(
            num_slots=self.slots.capacity,
            free_slots=self.slots.free_count,
            live=len(self.slots),
            pending=self.queued(),
            steps=self.steps,
            batches_sent=self.batches_sent,
            tokens_sent=self.tokens_sent,
            tombstones=len(self.gone),
            failed_inserts=self.failed_inserts,
            kv_tokens=sum(state.context_len for _, state in self.slots.live()),
            kv_capacity=self.slots.capacity * self.engine.max_seq_len,
            kv_bytes_received=self.kv_bytes_received,
            step_time=self.step_time.snapshot(),
            step_gap=self.step_gap.snapshot(),
            insert_time=self.insert_time.snapshot(),
            chunks=self.chunks,
            compiling=self.engine.multistep_pending,
        )

    def idle(self) -> bool:
        return not self.slots and not self.queued()

    def close(self) -> None:
        self.constrained.close()
