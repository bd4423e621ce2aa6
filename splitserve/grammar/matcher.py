"""One request's grammar state: an llguidance matcher, advanced by each token in output order.

A matcher is never shipped between processes: each worker that needs it builds it from the
serialized grammar and replays the output so far (the prefill worker for a resumed request, the
decode worker for every request it inserts, including one moved from a dead worker).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask


class GrammarError(ValueError):
    """A grammar that cannot be built, or output it cannot follow (the request fails)."""


def mask_words(vocab_size: int) -> int:
    """Words of one packed mask row: W = ceil(vocab_size / 32)."""
    return (vocab_size + 31) // 32


class GrammarState:
    """The matcher of one request, plus the ids that end its output (eos and stop ids)."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str, end_ids: Iterable[int]):
        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"grammar: {self.matcher.get_error()}")
        self.vocab_size = tokenizer.vocab_size
        self.failed = ""  # why the mask could not be computed (the request must fail)
        self.end_ids = np.asarray(sorted(t for t in end_ids if 0 <= t < self.vocab_size), np.int64)

    def replay(self, tokens: Sequence[int]) -> None:
        """Advance by the output so far (GrammarError if the grammar does not allow it)."""
        if tokens and not self.matcher.consume_tokens([int(t) for t in tokens]):
            raise GrammarError(f"the output so far breaks the grammar: {self.matcher.get_error()}")

    def advance(self, token: int) -> None:
        """One sampled token. An end token needs no advance (the request ends with it); after
        the grammar has ended, only end tokens are allowed, so nothing else can come."""
        if self.failed:
            raise GrammarError(self.failed)
        if token in self.end_ids or self.matcher.is_stopped():
            return
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(f"a token broke the grammar: {self.matcher.get_error()}")

    def fill(self, row: np.ndarray) -> None:
        """The next token's allowed set into row [W] int32 (a view of a [m, W] array). Once the
        grammar is complete, every end token is allowed (llguidance allows its own eos)."""
        if self.matcher.is_stopped():
            row[:] = 0
        else:
            fill_next_token_bitmask(self.matcher, row[None], 0)
            if self.matcher.is_error():
                raise GrammarError(f"grammar: {self.matcher.get_error()}")
        if self.matcher.is_accepting() or self.matcher.is_stopped():
            ends = self.end_ids
            bits = np.left_shift(np.uint32(1), (ends % 32).astype(np.uint32))
            np.bitwise_or.at(row.view(np.uint32), ends // 32, bits)
        if not row.any():
            raise GrammarError("the grammar allows no next token")

    def mask(self) -> np.ndarray:
        """The next token's allowed set as a fresh row [W] int32."""
        row = np.zeros(mask_words(self.vocab_size), np.int32)
        self.fill(row)
        return row
