"""The decode worker's TokenBatches: one per detok worker per step (or chunk), in slot order, each
token with its output position, finish and (when asked for) its alternatives."""

from __future__ import annotations

from decode_worker.slots import Slot
from splitserve.protocol import Source, TokenBatch, TokenFinish

Batches = dict[int, TokenBatch]  # detok worker -> the batch of its tokens


def batch_for(batches: Batches, detok: int, step: int) -> TokenBatch:
    """Detok worker `detok`'s batch, begun at `step` if it has none yet."""
    batch = batches.get(detok)
    if batch is None:
        batch = batches[detok] = TokenBatch(Source.DECODE, step, [], [], [], [], [], [])
    return batch


def append(
    batch: TokenBatch, state: Slot, seq: int, token: int, logprob: float, finish: int,
    top: tuple[list[int], list[float]] | None = None,
) -> None:  # fmt: skip
    if top is not None and not batch.top_ids:  # the batch's first alternatives
        batch.top_ids.extend([] for _ in batch.tokens)
        batch.top_logprobs.extend([] for _ in batch.tokens)
    batch.request_ids.append(state.request_id)
    batch.epochs.append(state.epoch)
    batch.seqs.append(seq)
    batch.tokens.append(token)
    batch.logprobs.append(logprob)
    batch.finishes.append(finish)
    if batch.top_ids or top is not None:
        ids, lps = top if top is not None else ([], [])
        batch.top_ids.append(ids)
        batch.top_logprobs.append(lps)


def resend(state: Slot, from_seq: int, batch: TokenBatch) -> None:
    """Every token the slot holds from output position from_seq on (a Repin: its stream's new
    detok worker has not seen them), with the finish of its last token."""
    start = max(0, from_seq - state.first_seq)
    last = len(state.tokens) - 1
    for offset in range(start, len(state.tokens)):
        finish = state.finish if offset == last else TokenFinish.NONE
        top = state.tops[offset] if state.tops else None
        append(batch, state, state.first_seq + offset, state.tokens[offset],
               state.logprobs[offset], finish, top)  # fmt: skip
