"""SentencePiece (tokenizer.model, or a GGUF "llama" vocabulary) behind the Tokenizer interface.

decode() is SentencePiece's own, with two documented choices of ours:
- skip_special_tokens=True drops control tokens before decoding (as Hugging Face does), so a
  control token between two byte-fallback tokens does not split their character;
- skip_special_tokens=False renders a control token as its text where SentencePiece renders
  nothing, and changes nothing else (per-piece surfaces of SentencePiece's own decode).

Edge cases the TokenTable mirrors (lead rule "sentencepiece"): only the first non-control piece
loses its leading "▁", and only when it is a normal piece (<unk> renders as " ⁇ " and a byte
piece as its byte, both unstripped); with remove_extra_whitespaces SentencePiece keeps stripping
while its output is still empty ("sentencepiece_repeat"). Invalid UTF-8 from byte pieces becomes
one U+FFFD per byte (PER_BYTE_REPLACE), as SentencePiece does. Not mirrored: a model with a
denormalizer or treat_whitespace_as_suffix (a warning is logged).
Added tokens of tokenizer_config.json beyond the SentencePiece vocabulary are special tokens.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterable, Sequence

import sentencepiece

from splitserve.tokenizers.base import PER_BYTE_REPLACE, Tokenizer, TokenTable
from splitserve.tokenizers.chat_template import ChatTemplate, end_of_generation_ids
from splitserve.tokenizers.hf_tokenizer import (
    config_token_text,
    folder_chat_template,
    read_json_config,
)

log = logging.getLogger(__name__)

SPACE = "▁"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")

# --- a minimal protobuf codec, for the few ModelProto fields we read or write ----------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _read_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of a serialized message; length-delimited values as bytes."""
    fields: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        fields.append((number, value))
    return fields


def build_model_proto(
    pieces: Sequence[str],
    scores: Sequence[float],
    types: Sequence[int],
    *,
    add_dummy_prefix: bool = True,
) -> bytes:
    """A serialized SentencePiece BPE ModelProto from a vocabulary (as a GGUF "llama" one).

    Identity normalizer (no NFKC, spaces kept), as llama.cpp tokenizes; byte fallback when the
    vocabulary has all 256 byte pieces.
    """
    out = bytearray()
    for piece, score, kind in zip(pieces, scores, types, strict=True):
        body = _bytes_field(1, piece.encode()) + _field(2, 5, struct.pack("<f", score))
        body += _field(3, 0, _varint(kind))
        out += _bytes_field(1, body)
    byte_fallback = sum(1 for kind in types if kind == 6) == 256
    trainer = _field(3, 0, _varint(2)) + _field(4, 0, _varint(len(pieces)))  # model_type=BPE
    trainer += _field(35, 0, _varint(int(byte_fallback)))
    out += _bytes_field(2, trainer)
    normalizer = _bytes_field(1, b"identity") + _field(3, 0, _varint(int(add_dummy_prefix)))
    normalizer += _field(4, 0, _varint(0)) + _field(5, 0, _varint(1))
    out += _bytes_field(3, normalizer)
    return bytes(out)


class _ProtoFacts:
    """The ModelProto facts that decode behaviour depends on."""

    def __init__(self, proto: bytes) -> None:
        self.add_dummy_prefix = True
        self.remove_extra_whitespaces = True
        self.denormalizer = False
        self.whitespace_suffix = False
        for number, value in _read_fields(proto):
            if number == 3 and isinstance(value, bytes):
                for sub, flag in _read_fields(value):
                    if sub == 3:
                        self.add_dummy_prefix = bool(flag)
                    elif sub == 4:
                        self.remove_extra_whitespaces = bool(flag)
            elif number == 5 and isinstance(value, bytes):
                self.denormalizer = any(
                    sub in (1, 2, 6) and data for sub, data in _read_fields(value)
                )
            elif number == 2 and isinstance(value, bytes):
                trainer = _read_fields(value)
                self.whitespace_suffix = any(sub == 24 and flag for sub, flag in trainer)


class SentencePieceTokenizer(Tokenizer):
    def __init__(
        self,
        model_proto: bytes,
        *,
        bos_id: int | None = -1,
        eos_ids: Iterable[int] | None = None,
        chat_template: str | None = None,
        add_bos: bool | None = None,
        added_tokens: dict[int, str] | None = None,
    ) -> None:
        """bos_id=-1 means SentencePiece's own; eos_ids=None means [SentencePiece's eos].
        added_tokens: {id: text} beyond the SentencePiece vocabulary (special tokens)."""
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self._facts = _ProtoFacts(model_proto)
        if self._facts.denormalizer or self._facts.whitespace_suffix:
            log.warning("SentencePiece denormalizer/whitespace-suffix: streamed text may differ")
        sp = self._sp
        self._n = sp.get_piece_size()
        self._extra = {i: t for i, t in (added_tokens or {}).items() if i >= self._n and t}
        self.vocab_size = max([self._n - 1, *self._extra]) + 1
        self._control = frozenset(i for i in range(self._n) if sp.is_control(i))
        self.special_ids = self._control | frozenset(self._extra)
        if bos_id == -1:
            bos_id = sp.bos_id()
        self.bos_id = bos_id if bos_id is not None and 0 <= bos_id < self.vocab_size else None
        eos = [sp.eos_id()] if eos_ids is None else list(eos_ids)
        self.eos_ids = end_of_generation_ids(eos, self._special_id_of)
        self.add_bos = self.bos_id is not None and (add_bos is None or add_bos)
        # Special texts in the input become their ids (a chat template writes them as text).
        texts = {sp.id_to_piece(i): i for i in self._control}
        texts.update({t: i for i, t in self._extra.items()})
        self._special_by_text = texts
        alternatives = sorted(texts, key=len, reverse=True)
        self._special_split = (
            re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if texts else None
        )
        # A control id stands in for added tokens inside SentencePiece's decode (it splits
        # byte runs and renders nothing, as an added token's boundary should).
        self._stand_in = min(self._control) if self._control else None
        bos_text, eos_text = self._piece_text(self.bos_id), self._piece_text(next(iter(eos), None))
        self.chat_template = (
            ChatTemplate(chat_template, bos_text, eos_text) if chat_template else None
        )
        self._table: TokenTable | None = None

    @classmethod
    def from_file(cls, path: str) -> SentencePieceTokenizer:
        """Load tokenizer.model; tokenizer_config.json beside it adds bos/eos, added tokens and
        the chat template."""
        with open(path, "rb") as f:
            proto = f.read()
        folder = os.path.dirname(os.path.abspath(path))
        config = read_json_config(os.path.join(folder, "tokenizer_config.json"))
        added = {
            int(i): t.get("content", "")
            for i, t in (config.get("added_tokens_decoder") or {}).items()
            if isinstance(t, dict)
        }
        probe = sentencepiece.SentencePieceProcessor(model_proto=proto)

        def id_of(key: str) -> int | None:
            text = config_token_text(config.get(key))
            if text is None:
                return None
            for i, t in added.items():
                if t == text:
                    return i
            i = probe.piece_to_id(text)
            return i if probe.id_to_piece(i) == text else None

        eos = id_of("eos_token")
        add_bos = config.get("add_bos_token")
        return cls(
            proto,
            bos_id=id_of("bos_token") if "bos_token" in config else -1,
            eos_ids=[eos] if eos is not None else None,
            chat_template=folder_chat_template(folder, config),
            add_bos=add_bos if isinstance(add_bos, bool) else None,
            added_tokens=added,
        )

    def _piece_text(self, token_id: int | None) -> str:
        if token_id is None or not 0 <= token_id < self._n:
            return ""
        return self._sp.id_to_piece(token_id)

    def _special_id_of(self, text: str) -> int | None:
        for i, t in self._extra.items():
            if t == text:
                return i
        i = self._sp.piece_to_id(text)
        return i if i in self._control and self._sp.id_to_piece(i) == text else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = [self.bos_id] if add_special_tokens and self.add_bos else []
        parts = self._special_split.split(text) if self._special_split else [text]
        for n, part in enumerate(parts):
            if n % 2:
                ids.append(self._special_by_text[part])
            elif part:
                ids.extend(self._sp.encode(part))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """SentencePiece's decode; ids outside the vocabulary are ignored."""
        valid = [i for i in ids if 0 <= i < self.vocab_size]
        if skip_special_tokens:
            return self._sp.decode([i for i in valid if i not in self.special_ids])
        if not valid:
            return ""
        stand_in = self._stand_in
        sp_ids = [i if i < self._n else stand_in for i in valid]
        if None in sp_ids:  # no control piece to stand in: added tokens split the decode
            return "".join(self._decode_runs(valid))
        return "".join(
            self._text_of(i) if i in self.special_ids else surface
            for i, surface in zip(valid, self._surfaces(sp_ids), strict=True)
        )

    def _surfaces(self, ids: list[int]) -> list[str]:
        """Each id's share of SentencePiece's own decode (SentencePieceText.pieces[].surface)."""
        text = self._sp.decode(ids, out_type="serialized_proto")
        surfaces = []
        for number, piece in _read_fields(text):
            if number == 2 and isinstance(piece, bytes):
                surface = [v for n, v in _read_fields(piece) if n == 3 and isinstance(v, bytes)]
                surfaces.append(surface[0].decode() if surface else "")
        return surfaces

    def _decode_runs(self, ids: list[int]) -> list[str]:
        out, run = [], []
        for i in ids:
            if i >= self._n:
                out.append(self.decode(run, skip_special_tokens=False) if run else "")
                out.append(self._extra[i])
                run = []
            else:
                run.append(i)
        out.append(self.decode(run, skip_special_tokens=False) if run else "")
        return out

    def _text_of(self, token_id: int) -> str:
        return self._extra.get(token_id) or self._sp.id_to_piece(token_id)

    def token_table(self) -> TokenTable:
        if self._table is None:
            self._table = self._build_table()
        return self._table

    def _build_table(self) -> TokenTable:
        sp = self._sp
        pieces: list[bytes] = []
        lead_pieces: dict[int, bytes] = {}
        for i in range(self.vocab_size):
            if i >= self._n:
                pieces.append(self._extra.get(i, "").encode())
                continue
            text = sp.id_to_piece(i)
            if i in self._control:
                pieces.append(text.encode())
            elif sp.is_unknown(i):
                surface = sp.decode([i]).encode()  # the unk surface, " ⁇ " by default
                pieces.append(surface)
                lead_pieces[i] = surface
            elif sp.is_byte(i):
                piece = bytes([int(_BYTE_PIECE.fullmatch(text).group(1), 16)])
                pieces.append(piece)
                lead_pieces[i] = piece
            else:
                piece = text.replace(SPACE, " ").encode()
                pieces.append(piece)
                lead = text[1:] if text.startswith(SPACE) else text
                lead_bytes = lead.replace(SPACE, " ").encode()
                if lead_bytes != (piece[1:] if piece.startswith(b" ") else piece):
                    lead_pieces[i] = lead_bytes
        facts = self._facts
        return TokenTable(
            pieces=tuple(pieces),
            special_ids=self.special_ids,
            strip_leading_space=facts.add_dummy_prefix or facts.remove_extra_whitespaces,
            lead_rule="sentencepiece_repeat" if facts.remove_extra_whitespaces else "sentencepiece",
            lead_pieces=lead_pieces,
            utf8_errors=PER_BYTE_REPLACE,
        )

