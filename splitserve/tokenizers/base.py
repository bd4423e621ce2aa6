"""One interface over every tokenizer kind (SentencePiece, Hugging Face tokenizer.json, GGUF vocab).

Incremental detokenization never calls decode() on a growing list: it needs, per token id, the
exact bytes that token contributes to the output (TokenTable). decode() is the tokenizer's own full
decode, the reference that streamed text must equal.
"""

from __future__ import annotations

import abc
import codecs
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from splitserve.tokenizers.chat_template import ChatTemplate, render_chat

# Codec error handler that turns every byte of an invalid UTF-8 sequence into its own U+FFFD, as
# SentencePiece and the Hugging Face ByteFallback decoder do (Python's "replace" gives one U+FFFD
# per maximal invalid subsequence, as Rust's from_utf8_lossy does for byte-level BPE).
PER_BYTE_REPLACE = "splitserve-per-byte-replace"


def _replace_each_byte(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "\ufffd" * (error.end - error.start), error.end


codecs.register_error(PER_BYTE_REPLACE, _replace_each_byte)

# Which leading space strip_leading_space removes. "Armed" means: the next token's output is
# lead_pieces.get(id, piece minus one leading space) instead of its piece.
#   first_piece: armed until the first non-skipped token with a non-empty piece (a Hugging Face
#     Strip decoder after Fuse: one space off the start of the whole output).
#   first_token: armed for the first non-skipped token only (Hugging Face Metaspace decoder).
#   sentencepiece: special tokens neither count nor get stripped; armed for the first other token
#     (SentencePiece with add_dummy_prefix).
#   sentencepiece_repeat: as sentencepiece, but armed until the output of non-special tokens is
#     non-empty (SentencePiece with remove_extra_whitespaces).
LEAD_RULES = ("first_piece", "first_token", "sentencepiece", "sentencepiece_repeat")


@dataclass(frozen=True)
class TokenTable:
    """Per-id output bytes, for constant-cost incremental detokenization.

    pieces[i] is what token i contributes to the UTF-8 byte stream (a special token contributes
    its text when not skipped). strip_leading_space: SentencePiece-style decoders drop one leading
    space of the whole output (the dummy prefix), so the detokenizer drops it from the first piece;
    lead_rule says precisely which piece is "first" (see LEAD_RULES) and lead_pieces holds the ids
    whose first-position output is not simply their piece minus one leading space (byte-fallback
    and <unk> pieces that keep it, Metaspace tokens that lose every space). utf8_errors is the codec
    error handler that turns the byte stream into the text decode() gives.
    """

    pieces: tuple[bytes, ...]
    special_ids: frozenset[int]
    strip_leading_space: bool
    lead_rule: str = "first_piece"
    lead_pieces: Mapping[int, bytes] = field(default_factory=dict)
    utf8_errors: str = "replace"

    def __post_init__(self) -> None:
        if self.lead_rule not in LEAD_RULES:
            raise ValueError(f"lead_rule must be one of {LEAD_RULES}, not {self.lead_rule!r}")


class Tokenizer(abc.ABC):
    vocab_size: int
    bos_id: int | None
    eos_ids: frozenset[int]  # ids that end generation (eos, and e.g. <|im_end|> for chat models)
    special_ids: frozenset[int]
    add_bos: bool  # whether encode(add_special_tokens=True) prepends bos

    @abc.abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    @abc.abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    @abc.abstractmethod
    def token_table(self) -> TokenTable: ...

    # the model's chat template (chat_sources.py says from where), None when it has none
    chat_template: ChatTemplate | None = None

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **extra
    ) -> str:
        """Render with the model's chat template; `extra` are the template's other variables
        (tools, and a request's chat_template_kwargs)."""
        return render_chat(self.chat_template, messages, add_generation_prompt, **extra)
