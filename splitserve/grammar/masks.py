"""The decode worker's grammar states by slot, and the masks of its next step.

The mask for step n+1 needs step n's token, so it cannot be computed before step n ends; it is
computed on a thread of its own (llguidance releases the GIL) from the moment step n's tokens
are known, while the loop sends them, handles its messages and inserts new prefixes; the engine
waits for it only after it has dispatched step n+1's model pass (StepMasks.wait()).

  step n ends -> advance(tokens) -> prepare(): thread computes masks(n+1)
             -> loop: send batches, dispatch, insert (add() for new constrained slots)
             -> masks(): StepMasks of the slots live now -> engine.generate(masks=...)

A mask belongs to one request's grammar state, not to its slot: a request freed while its mask
was computed (a stop string, an abort) leaves that mask behind, and its slot may take the next
request before the step. So every add() gives the slot a new generation, a computed mask is
keyed by (slot, generation), and masks() uses only those of the states live now.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from itertools import count

import numpy as np

from splitserve.engine.interface import StepMasks
from splitserve.grammar.matcher import GrammarError, GrammarState, mask_words

Key = tuple[int, int]  # (slot, generation of its grammar state)


class SlotGrammars:
    """Grammar states of the constrained slots of one engine."""

    def __init__(self, vocab_size: int):
        self.words = mask_words(vocab_size)
        self.states: dict[int, GrammarState] = {}
        self._generation: dict[int, int] = {}  # slot -> the generation of its state
        self._generations = count()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        # the masks being computed: (keys, future of {key: row | GrammarError}), a key being
        # (slot, generation)
        self._pending: tuple[tuple[Key, ...], Future] | None = None

    def __bool__(self) -> bool:
        return bool(self.states)

    def add(self, slot: int, state: GrammarState) -> None:
        self._settle()
        self.states[slot] = state
        self._generation[slot] = next(self._generations)

    def remove(self, slot: int) -> None:
        if slot in self.states:
            self._settle()  # the thread may be computing this slot's mask: let it finish
            del self.states[slot]
            del self._generation[slot]

    def advance(self, tokens: list[int]) -> dict[int, str]:
        """Each constrained slot's token of the step; {slot: error} of slots it broke."""
        self._settle()
        errors = {}
        for slot, state in self.states.items():
            try:
                state.advance(tokens[slot])
            except GrammarError as exc:
                errors[slot] = str(exc)
        return errors

    def prepare(self) -> None:
        """Start computing the next step's masks of the slots constrained now."""
        self._settle()
        if self.states:
            keys = self._keys()
            states = [self.states[s] for s, _ in keys]
            self._pending = (keys, self._pool.submit(_compute, keys, states, self.words))

    def masks(self) -> tuple[StepMasks | None, dict[int, str]]:
        """The masks of every constrained slot for the step about to run (a Future when they
        are still being computed), and {slot: error} of slots whose grammar failed (the caller
        fails their requests; they get no row). Slots added since prepare() are computed now."""
        pending, self._pending = self._pending, None
        if not self.states:
            if pending is not None:
                pending[1].result()
            return None, {}
        keys = self._keys()
        slots = tuple(s for s, _ in keys)
        if pending is not None and pending[0] == keys:
            future = pending[1]
        else:  # the set changed (or nothing was prepared): compute what is missing now; a
            # mask of a state removed since (its slot maybe taken again) is never used
            ready = pending[1].result() if pending is not None else {}
            missing = [k for k in keys if k not in ready]
            states = [self.states[s] for s, _ in missing]
            rows = {**ready, **_compute(missing, states, self.words)}
            future = Future()
            future.set_result({k: rows[k] for k in keys})
        result = future.result() if future.done() else None
        if result is not None:
            result = _by_slot(result)
            errors = {s: str(r) for s, r in result.items() if isinstance(r, GrammarError)}
            if errors:
                good = [s for s in slots if s not in errors]
                return _masks(good, {s: result[s] for s in good}, self.words), errors
            return _masks(slots, result, self.words), {}
        # still computing: the engine waits for it after dispatching its model pass; a slot
        # whose grammar fails on the thread is reported by the next advance(), before its token
        # is used (its row allows every token meanwhile, see _as_bits)
        bits: Future = Future()
        future.add_done_callback(lambda f: _resolve(bits, f, slots, self.words))
        return StepMasks(np.asarray(slots, np.int32), bits), {}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _keys(self) -> tuple[Key, ...]:
        """(slot, generation) of every state live now, in slot order."""
        return tuple((s, self._generation[s]) for s in sorted(self.states))

    def _settle(self) -> None:
        """Wait for the thread (the states are not touched while it runs)."""
        if self._pending is not None:
            self._pending[1].result()


def _compute(keys, states, words: int) -> dict[Key, np.ndarray | GrammarError]:
    out: dict[Key, np.ndarray | GrammarError] = {}
    for key, state in zip(keys, states, strict=True):
        row = np.zeros(words, np.int32)
        try:
            state.fill(row)
            out[key] = row
        except Exception as exc:  # noqa: BLE001 - one request's grammar fails, not the loop
            error = exc if isinstance(exc, GrammarError) else GrammarError(f"grammar engine: {exc}")
            state.failed = str(error)  # advance() reports it, whatever token the step gave
            out[key] = error
    return out


def _by_slot(rows: dict[Key, np.ndarray | GrammarError]) -> dict[int, np.ndarray | GrammarError]:
    return {slot: row for (slot, _), row in rows.items()}


def _as_bits(slots, rows, words: int) -> np.ndarray:
    bits = np.empty((len(slots), words), np.int32)
    for i, slot in enumerate(slots):
        row = rows[slot]
        bits[i] = row if isinstance(row, np.ndarray) else -1  # a failed grammar: see masks()
    return bits


def _masks(slots, rows, words: int) -> StepMasks | None:
    if not slots:
        return None
    return StepMasks(np.asarray(slots, np.int32), _as_bits(slots, rows, words))


def _resolve(bits: Future, done: Future, slots, words: int) -> None:
    try:
        bits.set_result(_as_bits(slots, _by_slot(done.result()), words))
    except BaseException as exc:  # noqa: BLE001 - handed to the engine that waits
        bits.set_exception(exc)
