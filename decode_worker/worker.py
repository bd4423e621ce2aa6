"""The decode worker: inserts prefixes into free slots and runs the batched decode loop.

A request's path through this process:
 1. A PrefixHeader (with its KV cache as extra frames) arrives from the prefill worker; the arrays
    are read-only views over the received frames, not copies.
 2. If the request was aborted or finished by a stop string before its prefix arrived, the prefix
    is dropped (tombstones remember such ids for a while). Otherwise it waits in a bounded pending
    queue.
 3. Once a loop pass has handled its messages, pending prefixes take free slots of the slot table
    (lowest index first) and go into the engine (engine.insert).
 4. One engine.generate() step advances every live slot by one token.
 5. Each token is checked against the finish rules (eos / stop ids, max_tokens, context limit).
 6. The tokens of the step are grouped by their stamped detok worker, in slot order, and sent as
    one TokenBatch per detok worker (only to those with tokens); sends never block.
 7. A slot is freed on a finishing token, on Abort from the router, or on Finish from the detok
    worker (stop string) - each within one step of the message arriving.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from decode_worker.slots import Slot, SlotTable
from splitserve import protocol
from splitserve.engine.interface import Prefix
from splitserve.protocol import (
    Abort,
    DecodeLoad,
    Finish,
    PrefixHeader,
    Source,
    TokenBatch,
    TokenFinish,
    WorkerInfo,
)
from splitserve.stats import Histogram
from splitserve.stopping import token_finish
from splitserve.tombstones import Tombstones
from splitserve.worker import WorkerLoop

log = logging.getLogger(__name__)


class DecodeWorker(WorkerLoop):
    role = "decode"

    def setup(self) -> None:
        config = self.config
        self.engine = self.make_engine()
        self.detoks = self.detok_senders("decode_to_detok")
        self.slots = SlotTable(self.engine.num_slots)
        self.pending: deque[tuple[PrefixHeader, list[Any]]] = deque()
        # the router admits at most max_running requests; the slack covers prefixes of aborted
        # requests that arrive before their Abort does (they are dropped when it comes)
        self.max_pending = 2 * config.router.max_running + 4 * self.engine.num_slots
        self.gone = Tombstones(config.lifecycle.state_ttl_s)
        self.step_time = Histogram()
        self.step_gap = Histogram()  # start-to-start time of consecutive busy steps
        self.steps = 0
        self.batches_sent = 0  # TokenBatches to detok workers: at most one per detok per step
        self.tokens_sent = 0
        self._last_step_start: float | None = None
        self.failed_inserts = 0
        self.handlers = {
            PrefixHeader: self.on_prefix,
            Abort: self.on_release,
            Finish: self.on_release,
        }

    def own_address(self) -> str:
        return self.config.addresses.decode

    def warmup(self) -> WorkerInfo:
        self.engine.warmup(prefill=False)  # only this role's side of the engine
        return WorkerInfo(max_seq_len=self.engine.max_seq_len, num_slots=self.engine.num_slots)

    def loop_once(self) -> None:
        idle = self.idle()
        if idle:
            self._last_step_start = None  # an idle pause is not a stall
        self.dispatch(self.receive(wait=idle))
        self.insert_pending()
        if self.slots:
            self.step()
        self.gone.prune()

    # ---- messages ----
    def on_prefix(self, header: PrefixHeader, frames: list[Any]) -> None:
        """A prefix from prefill (its KV arrays in frames) waits for a free slot."""
        rid = header.request_id
        if rid in self.gone:
            return
        if rid in self.slots or any(h.request_id == rid for h, _ in self.pending):
            self.fail([rid], "duplicate request id at decode")
            return
        if not 0 <= header.detok_index < len(self.detoks):
            self.fail([rid], f"detok index {header.detok_index} out of range")
            return
        if len(self.pending) >= self.max_pending:
            self.fail([rid], "decode worker overloaded: pending queue full")
            return
        self.pending.append((header, frames))

    def on_release(self, msg: Abort | Finish, _frames: list[Any]) -> None:
        for rid in msg.request_ids:
            self.release(rid)

    def release(self, rid: str) -> None:
        """Abort or stop-string finish: free the slot now, or drop the prefix when it arrives."""
        self.gone.add(rid)
        slot = self.slots.release(rid)
        if slot is not None:
            log.info("%s released from slot %d", rid, slot)
            self.engine.free(slot)
            return
        for i, (h, _) in enumerate(self.pending):
            if h.request_id == rid:
                del self.pending[i]
                return

    def insert_pending(self) -> None:
        while self.pending and self.slots.free_count:
            header, frames = self.pending.popleft()
            rid = header.request_id
            slot = self.slots.take(Slot(rid, header.detok_index, header.stop, 1, header.length + 1))
            try:
                kv = protocol.arrays_from_frames(header.kv_meta, frames)
                prefix = Prefix(kv, header.length, header.first_token, header.first_logprob)
                self.engine.insert(prefix, slot, header.sampling)
            except (protocol.ProtocolError, ValueError) as exc:
                self.slots.release(rid)  # the engine never took it: nothing to free there
                self.failed_inserts += 1
                self.fail([rid], f"cannot insert prefix: {exc}")
                continue
            log.info("%s inserted in slot %d", rid, slot)

    # ---- the decode step ----
    def step(self) -> None:
        """Advance every live slot by one token; send each detok worker its tokens of the step."""
        start = time.perf_counter()
        if self._last_step_start is not None:
            self.step_gap.observe(start - self._last_step_start)
        self._last_step_start = start
        out = self.engine.generate()
        self.steps += 1
        batches = self.collect(out.tokens.tolist(), out.logprobs.tolist())
        self.send_batches(batches)
        self.step_time.observe(time.perf_counter() - start)

    def collect(self, tokens: list[int], logprobs: list[float]) -> dict[int, TokenBatch]:
        """The step's tokens (indexed by slot) grouped by detok worker, in slot order within each
        batch; a slot whose token finishes its request is freed."""
        batches: dict[int, TokenBatch] = {}
        max_seq_len = self.engine.max_seq_len
        for slot, state in self.slots.live():
            token = tokens[slot]
            seq = state.next_seq
            state.next_seq += 1
            finish = token_finish(state.stop, token, seq + 1, state.context_len, max_seq_len)
            state.context_len += 1
            batch = batches.get(state.detok_index)
            if batch is None:
                batch = batches[state.detok_index] = TokenBatch(
                    Source.DECODE, self.steps, [], [], [], [], []
                )
            batch.request_ids.append(state.request_id)
            batch.seqs.append(seq)
            batch.tokens.append(token)
            batch.logprobs.append(logprobs[slot])
            batch.finishes.append(finish)
            if finish != TokenFinish.NONE:
                log.info("%s finished in slot %d after %d tokens", state.request_id, slot, seq + 1)
                self.slots.release(state.request_id)
                self.engine.free(slot)
        return batches

    def send_batches(self, batches: dict[int, TokenBatch]) -> None:
        """One TokenBatch per detok worker with tokens in this step; sends never block."""
        for detok_index, batch in batches.items():
            self.detoks[detok_index].send(batch)
        self.batches_sent += len(batches)
        self.tokens_sent += sum(len(b.tokens) for b in batches.values())

    # ---- lifecycle ----
    def load(self) -> DecodeLoad:
        return DecodeLoad(
            num_slots=self.slots.capacity,
            free_slots=self.slots.free_count,
            live=len(self.slots),
            pending=len(self.pending),
            steps=self.steps,
            batches_sent=self.batches_sent,
            tokens_sent=self.tokens_sent,
            tombstones=len(self.gone),
            failed_inserts=self.failed_inserts,
            step_time=self.step_time.snapshot(),
            step_gap=self.step_gap.snapshot(),
        )

    def idle(self) -> bool:
        return not self.slots and not self.pending
