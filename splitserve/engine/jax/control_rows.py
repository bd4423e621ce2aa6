"""The JAX engine's per-row logits-control state on the host, in the arrays controls.process
takes (see there for their layout).

Kept on the host and sent with each controlled step: the step's tokens come back to the host
anyway, so counting them here costs a few numpy writes, and a batch without controls never
touches any of this. Rows follow the engine's rows (insert, compaction moves, free).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitserve.engine.interface import MAX_BAD_WORDS, MAX_LOGIT_BIAS, LogitsControls
from splitserve.engine.jax import controls as ctl


def check_controls(controls: LogitsControls, vocab_size: int) -> None:
    """A ValueError when the controls name a token outside the vocabulary."""
    why = controls.outside(vocab_size)
    if why:
        raise ValueError(why)


class ControlRows:
    def __init__(self, rows: int, vocab: int):
        self.vocab = vocab
        self.words_per_row = -(-vocab // 32)
        self.on = np.zeros(rows, bool)  # the row has controls (neutral ones included)
        self.cfloats = np.zeros((ctl.CF_ROWS, rows), np.float32)
        self.cfloats[ctl.REP] = 1.0
        self.flags = np.zeros((ctl.FLAG_ROWS, rows), np.int32)
        self.bias_ids = np.full((rows, MAX_LOGIT_BIAS), vocab, np.int32)
        self.bias_vals = np.zeros((rows, MAX_LOGIT_BIAS), np.float32)
        self.hist = np.zeros((rows, vocab), np.int32)
        self.history = np.zeros(rows, bool)  # hist matters (penalties)
        self.bad_words: list[list[list[int]]] = [[] for _ in range(rows)]
        self.output: list[list[int]] = [[] for _ in range(rows)]  # for bad-word matching

    def set(self, row: int, c: LogitsControls, context: np.ndarray | None, out_pos: int,
            first_token: int | None) -> None:  # fmt: skip
        """A request's controls into `row`. context: its prompt (the last out_pos tokens are
        its output so far); first_token: the token the slot feeds next (output too), or None
        at prefill, where nothing has been sampled yet."""
        self.clear(row)
        self.on[row] = True
        self.cfloats[:, row] = (c.repetition_penalty, c.frequency_penalty, c.presence_penalty,
                                c.min_p)  # fmt: skip
        self.flags[ctl.TOP_K_LOGPROBS, row] = c.top_logprobs
        n = len(c.bias_ids)
        self.bias_ids[row, :n] = c.bias_ids
        self.bias_vals[row, :n] = c.bias_values
        self.bad_words[row] = [list(w) for w in c.bad_words]
        ids = np.asarray(context if context is not None else [], np.int64)
        output = ids[len(ids) - out_pos :] if out_pos else ids[:0]
        output = [*output.tolist(), *([first_token] if first_token is not None else [])]
        self.history[row] = bool(c.presence_penalty or c.frequency_penalty
                                 or c.repetition_penalty != 1.0)  # fmt: skip
        if self.history[row]:
            self.hist[row, ids[: len(ids) - out_pos]] = 1  # the prompt: seen
            np.add.at(self.hist[row], np.asarray(output, np.int64), 2)
        self.output[row] = output

    def clear(self, row: int) -> None:
        self.on[row] = False
        self.cfloats[:, row] = (1.0, 0.0, 0.0, 0.0)
        self.flags[:, row] = 0
        self.bias_ids[row] = self.vocab
        self.bias_vals[row] = 0.0
        if self.history[row]:
            self.hist[row] = 0
        self.history[row] = False
        self.bad_words[row] = []
        self.output[row] = []

    def move(self, src: int, dst: int) -> None:
        """Compaction: row src's state to dst (a free row), src cleared."""
        for a in (self.cfloats, self.flags):
            a[:, dst] = a[:, src]
        for a in (self.on, self.bias_ids, self.bias_vals, self.hist, self.history):
            a[dst] = a[src]
        self.bad_words[dst], self.output[dst] = self.bad_words[src], self.output[src]
        self.history[src] = True  # so that clear() zeroes its counts
        self.clear(src)

    def record(self, rows: Sequence[int], tokens: Sequence[int]) -> None:
        """The step's tokens of the given rows: counted where penalties need them, kept where
        bad words must match the output's end."""
        for row, token in zip(rows, tokens, strict=True):
            if not self.on[row]:
                continue
            if self.history[row]:
                self.hist[row, token] += 2
            if self.bad_words[row]:
                self.output[row].append(int(token))

    def banned(self, batch: int) -> np.ndarray:
        """[batch, MAX_BAD_WORDS] the tokens bad words forbid at this step (pad: vocab): the last
        token of each word whose other tokens end the output."""
        out = np.full((batch, MAX_BAD_WORDS), self.vocab, np.int32)
        for row in range(batch):
            words, output = self.bad_words[row], self.output[row]
            n = 0
            for word in words:
                head = word[:-1]
                if not head or output[len(output) - len(head) :] == head:
                    out[row, n] = word[-1]
                    n += 1
        return out

    def allowed(self, rows: np.ndarray, masks: dict[int, np.ndarray]) -> np.ndarray:
        """[len(rows), W] packed allowed bits: the given rows' masks, every token elsewhere."""
        out = np.full((len(rows), self.words_per_row), -1, np.int32)
        for i, row in enumerate(rows.tolist()):
            if row in masks:
                out[i] = masks[row]
        return out

    def inputs(self, batch: int, masks: dict[int, np.ndarray],
               rows: np.ndarray | None = None) -> tuple:  # fmt: skip
        """The controls program's arguments after logits / ints / floats: for rows [0, batch),
        or for `rows` of the batch in that order (the engine's gather of the controlled rows;
        a row may repeat: padding to a compiled count)."""
        rows = np.arange(batch) if rows is None else np.asarray(rows)
        flags = self.flags[:, rows]  # fancy indexing: a copy
        args = (np.ascontiguousarray(self.cfloats[:, rows]), flags, self.allowed(rows, masks),
                self.bias_ids[rows], self.bias_vals[rows],
                self.banned(batch)[rows])  # fmt: skip
        if self.history[rows].any():
            args += (self.hist[rows],)
        return args
