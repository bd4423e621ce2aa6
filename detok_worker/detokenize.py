"""Per-request text logic of the detok worker: token ids -> text deltas -> stop-string cut.

Pure Python, no sockets. Both classes cost O(1) per call in the length of the output so far:

1. IncrementalDetokenizer.push(token_id) looks the token's bytes up in the TokenTable and feeds them
   to an incremental UTF-8 decoder, which holds at most the 3 bytes of an unfinished character.
   The concatenation of every push() and the final flush() equals tokenizer.decode(ids) exactly.
2. StopStringMatcher.push(text) searches only the held-back suffix plus the new text, and holds
   back only the longest suffix that could still be the start of a stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from splitserve.tokenizers.base import TokenTable


class IncrementalDetokenizer:
    """Turns one request's token ids, in order, into text deltas.

    Out-of-range ids (negative or >= len(table.pieces)) contribute nothing, exactly as the
    tokenizers' decode() ignores them; a model whose logits are wider than its vocabulary can
    therefore never crash a detok worker.
    """

    __slots__ = ("_pieces", "_skip", "_decoder", "_lead", "_lead_pieces", "_special")

    def __init__(self, table: TokenTable, skip_special_tokens: bool) -> None:
        self._pieces = table.pieces
        self._special = table.special_ids
        self._skip = table.special_ids if skip_special_tokens else frozenset()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors=table.utf8_errors)
        # The lead rule while armed (the next output may lose its leading space), else None.
        self._lead: str | None = table.lead_rule if table.strip_leading_space else None
        self._lead_pieces = table.lead_pieces

    def push(self, token_id: int) -> str:
        """Return the text that token_id completes (possibly empty: a partial character waits)."""
        if token_id < 0 or token_id >= len(self._pieces) or token_id in self._skip:
            return ""
        piece = self._pieces[token_id]
        if self._lead is not None:
            piece = self._lead_piece(token_id, piece)
        return self._decoder.decode(piece)

    def push_many(self, token_ids: Iterable[int]) -> str:
        """push() for each id, joined: one call per TokenBatch instead of one per token."""
        return "".join([self.push(token_id) for token_id in token_ids])

    def flush(self) -> str:
        """Return what is left at the end; an unfinished character becomes U+FFFD as in decode()."""
        return self._decoder.decode(b"", final=True)

    @property
    def pending_bytes(self) -> int:
        """Bytes held for an unfinished UTF-8 character (at most 3)."""
        return len(self._decoder.getstate()[0])

    def _lead_piece(self, token_id: int, piece: bytes) -> bytes:
        rule = self._lead
        if rule in ("sentencepiece", "sentencepiece_repeat") and token_id in self._special:
            return piece  # SentencePiece renders control tokens as nothing: they never count
        lead = self._lead_pieces.get(token_id)
        if lead is None:
            lead = piece[1:] if piece.startswith(b" ") else piece
        if rule == "first_piece":
            if piece:
                self._lead = None
        elif rule == "sentencepiece_repeat":
            if lead:
                self._lead = None
        else:  # first_token, sentencepiece: only the first counted token is ever stripped
            self._lead = None
        return lead


class StopStringMatcher:
    """Cuts a text stream at the first stop string, across any chunking of the text.

    The stream stops as soon as a stop string is complete: the output is the text before the
    occurrence that ends first (of those ending at the same place, the one that starts first),
    plus that stop string when include_stop. Text after it is dropped. Empty stop strings are
    ignored. Cost per push is O((held + new) * number of stops); held < the longest stop string.
    """

    __slots__ = ("_stops", "_prefixes", "_max_held", "_include_stop", "_held", "_stopped")

    def __init__(self, stops: list[str], include_stop: bool) -> None:
        self._stops = tuple(dict.fromkeys(stop for stop in stops if stop))
        # Every proper prefix of a stop string: the suffixes that must be held back.
        self._prefixes = frozenset(stop[:i] for stop in self._stops for i in range(1, len(stop)))
        self._max_held = max((len(stop) - 1 for stop in self._stops), default=0)
        self._include_stop = include_stop
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """Whether a stop string was found; after that every push returns ("", True)."""
        return self._stopped

    @property
    def held(self) -> str:
        """Text held back because it could still be the start of a stop string."""
        return self._held

    def push(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit now, whether a stop string was found)."""
        if self._stopped:
            return "", True
        if not self._stops:
            return text, False
        buffer = self._held + text
        best: tuple[int, int, str] | None = None  # (end, start, stop) of the earliest-ending match
        for stop in self._stops:
            start = buffer.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if best is None or candidate < best:
                    best = candidate
        if best is not None:
            _, start, stop = best
            self._stopped = True
            self._held = ""
            return buffer[:start] + (stop if self._include_stop else ""), True
        keep = self._held_suffix_length(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """Return the held text at a normal end of the stream (no stop string came)."""
        held, self._held = self._held, ""
        return "" if self._stopped else held

    def _held_suffix_length(self, buffer: str) -> int:
        for length in range(min(self._max_held, len(buffer)), 0, -1):
            if buffer[-length:] in self._prefixes:
                return length
        return 0
