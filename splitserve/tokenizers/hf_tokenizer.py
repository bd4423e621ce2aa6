"""Hugging Face `tokenizers` (tokenizer.json) behind the Tokenizer interface.

Also the engine of GGUF byte-level BPE vocabularies, which gguf_tokenizer.py turns into a
`tokenizers.Tokenizer`. The TokenTable mirrors the tokenizer's decoder token by token; decoders
supported exactly:

- ByteLevel (GPT-2, SmolLM, Llama 3, Qwen): each token maps back to its bytes; a token with a
  character outside the byte alphabet (an added token such as "<｜end▁of▁sentence｜>") gives its
  own UTF-8 text, as the decoder does.
- Metaspace: "▁" is a space; the first token loses every "▁" (lead rule first_token).
- Sequence of Replace(string), ByteFallback, Fuse, Strip(" ", start<=1, stop=0) (Llama 2, Gemma).
  Known inexactness: ByteFallback turns a run of byte tokens that is not valid UTF-8 into one
  U+FFFD per byte, even the bytes that form whole characters (the decoder needs the whole run);
  the stream decodes such a run per character (exactly as SentencePiece itself does). The two
  differ only for a run of byte tokens that holds both an invalid byte and a complete character.

Any other decoder gets a per-token table from decode([id]) and a warning: streamed text may then
differ from decode() (e.g. WordPiece "##" joining).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from functools import cache

import tokenizers

from splitserve.tokenizers.base import PER_BYTE_REPLACE, Tokenizer, TokenTable
from splitserve.tokenizers.chat_template import ChatTemplate, end_of_generation_ids

log = logging.getLogger(__name__)


@cache
def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by ByteLevel pre-tokenizers and decoders."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = [b for b in range(256) if b not in printable]
    mapping = {b: chr(b) for b in printable}
    mapping.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return mapping


@cache
def _byte_level_inverse() -> dict[str, int]:
    return {c: b for b, c in byte_level_alphabet().items()}


def _byte_level_piece(token: str) -> bytes:
    inverse = _byte_level_inverse()
    try:
        return bytes(inverse[c] for c in token)
    except KeyError:
        return token.encode()


def _byte_token_value(token: str) -> int | None:
    """The byte of a ByteFallback token "<0xNN>", else None (the decoder's own test)."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


class _DecoderPlan:
    """How one decoder maps token strings to table pieces."""

    def __init__(self, spec: dict | None) -> None:
        self.exact = True
        self.kind = "fallback"
        self.replaces: list[tuple[str, str]] = []
        self.byte_fallback = False
        self.strip_first_space = False
        self.metaspace = "▁"
        self._parse(spec)

    def _parse(self, spec: dict | None) -> None:
        steps = self._flatten(spec)
        if steps is None:
            self.exact = False
            return
        types = [step.get("type") for step in steps]
        if types == ["ByteLevel"]:
            self.kind = "byte_level"
            return
        if types == ["Metaspace"]:
            step = steps[0]
            self.kind = "metaspace"
            self.metaspace = step.get("replacement", "▁")
            scheme = step.get("prepend_scheme")
            if scheme is None:
                scheme = "always" if step.get("add_prefix_space", True) else "never"
            self.strip_first_space = scheme != "never"
            return
        self.kind = "pieces"
        fused = False
        for n, step in enumerate(steps):
            kind = step.get("type")
            if kind == "Replace" and not self.byte_fallback and not fused:
                pattern = step.get("pattern", {})
                if "String" not in pattern:
                    break
                self.replaces.append((pattern["String"], step.get("content", "")))
            elif kind == "ByteFallback" and not fused:
                self.byte_fallback = True
            elif kind == "Fuse":
                fused = True
            elif kind == "Strip" and n == len(steps) - 1 and (fused or not self.byte_fallback):
                start, stop = step.get("start", 0), step.get("stop", 0)
                if step.get("content") != " " or stop != 0 or start > 1 or (start and not fused):
                    break
                self.strip_first_space = start == 1
            else:
                break
        else:
            return
        self.kind = "fallback"
        self.exact = False

    @staticmethod
    def _flatten(spec: dict | None) -> list[dict] | None:
        if spec is None:
            return None  # tokens joined with spaces: not a per-token decoder
        if spec.get("type") == "Sequence":
            steps: list[dict] = []
            for sub in spec.get("decoders", []):
                inner = _DecoderPlan._flatten(sub)
                if inner is None:
                    return None
                steps.extend(inner)
            return steps
        return [spec]

    def piece(self, token: str) -> bytes:
        if self.kind == "byte_level":
            return _byte_level_piece(token)
        if self.kind == "metaspace":
            return token.replace(self.metaspace, " ").encode()
        for old, new in self.replaces:
            token = token.replace(old, new)
        if self.byte_fallback:
            value = _byte_token_value(token)
            if value is not None:
                return bytes([value])
        return token.encode()

    def lead_piece(self, token: str) -> bytes | None:
        """Output of token in the first position when it differs from piece minus one space."""
        if self.kind == "metaspace":
            lead = token.replace(self.metaspace, "").encode()
            piece = self.piece(token)
            default = piece[1:] if piece.startswith(b" ") else piece
            return lead if lead != default else None
        return None


def read_json_config(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def config_token_text(value) -> str | None:
    """tokenizer_config.json writes a token as a string or as an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def folder_chat_template(folder: str, config: dict) -> str | None:
    """A checkpoint folder's template: chat_template.jinja (what transformers writes since 4.49;
    it wins, as in transformers), else tokenizer_config.json's chat_template."""
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read() or None
    return config_chat_template(config)


def config_chat_template(config: dict) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` plus the bos/eos/chat-template facts that live beside it."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        bos_id: int | None = None,
        eos_ids: Iterable[int] = (),
        chat_template: str | None = None,
        add_bos: bool | None = None,
    ) -> None:
        self._tok = tokenizer
        self._tok.no_truncation()
        self._tok.no_padding()
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1
        self._plan = _DecoderPlan(json.loads(tokenizer.to_str()).get("decoder"))
        if not self._plan.exact:
            log.warning("tokenizer decoder not mirrored exactly; streamed text may differ")

        added = tokenizer.get_added_tokens_decoder()
        special_texts = {t.content for t in added.values() if t.special}
        special = {i for i, t in added.items() if t.special}
        for text in special_texts:  # the same text in the model vocabulary is skipped too
            model_id = tokenizer.model.token_to_id(text)
            if model_id is not None:
                special.add(model_id)
        self.special_ids = frozenset(special)

        self.bos_id = bos_id
        eos_explicit = list(eos_ids)

        def special_id_of(text: str) -> int | None:
            token_id = tokenizer.token_to_id(text)
            return token_id if token_id in self.special_ids else None

        self.eos_ids = end_of_generation_ids(eos_explicit, special_id_of)
        probe = tokenizer.encode("", add_special_tokens=True).ids
        self._post_processor_adds_bos = bos_id is not None and probe[:1] == [bos_id]
        self.add_bos = self._post_processor_adds_bos if add_bos is None else add_bos
        bos_text = tokenizer.id_to_token(bos_id) if bos_id is not None else None
        eos_id = eos_explicit[0] if eos_explicit else None
        eos_text = tokenizer.id_to_token(eos_id) if eos_id is not None else None
        self.chat_template = (
            ChatTemplate(chat_template, bos_text or "", eos_text or "") if chat_template else None
        )
        self._table: TokenTable | None = None

    @classmethod
    def from_file(cls, path: str) -> HFTokenizer:
        """Load tokenizer.json; bos/eos/chat template from tokenizer_config.json (and
        generation_config.json's eos ids) beside it when present."""
        tok = tokenizers.Tokenizer.from_file(path)
        folder = os.path.dirname(os.path.abspath(path))
        config = read_json_config(os.path.join(folder, "tokenizer_config.json"))
        generation = read_json_config(os.path.join(folder, "generation_config.json"))

        def id_of(key: str) -> int | None:
            text = config_token_text(config.get(key))
            return tok.token_to_id(text) if text is not None else None

        eos_ids = [i for i in [id_of("eos_token")] if i is not None]
        gen_eos = generation.get("eos_token_id")
        eos_ids += gen_eos if isinstance(gen_eos, list) else [gen_eos]
        add_bos = config.get("add_bos_token")
        return cls(
            tok,
            bos_id=id_of("bos_token"),
            eos_ids=[i for i in eos_ids if isinstance(i, int)],
            chat_template=folder_chat_template(folder, config),
            add_bos=add_bos if isinstance(add_bos, bool) else None,
        )

    @property
    def backend(self) -> tokenizers.Tokenizer:
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos and not self._post_processor_adds_bos:
            ids = [self.bos_id, *ids]
        elif add_special_tokens and not self.add_bos and self._post_processor_adds_bos:
            ids = ids[1:] if ids[:1] == [self.bos_id] else ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The library's decode; ids outside the vocabulary are ignored."""
        valid = [i for i in ids if 0 <= i < self.vocab_size]
        return self._tok.decode(valid, skip_special_tokens=skip_special_tokens)

    def token_table(self) -> TokenTable:
        if self._table is None:
            self._table = self._build_table()
        return self._table

    def _build_table(self) -> TokenTable:
        plan = self._plan
        pieces: list[bytes] = []
        lead_pieces: dict[int, bytes] = {}
        for token_id in range(self.vocab_size):
            token = self._tok.id_to_token(token_id)
            if token is None:
                pieces.append(b"")
                continue
            if plan.exact:
                pieces.append(plan.piece(token))
            else:
                pieces.append(self._tok.decode([token_id], skip_special_tokens=False).encode())
            lead = plan.lead_piece(token) if plan.exact else None
            if lead is not None:
                lead_pieces[token_id] = lead
        return TokenTable(
            pieces=tuple(pieces),
            special_ids=self.special_ids,
            strip_leading_space=plan.strip_first_space,
            lead_rule="first_token" if plan.kind == "metaspace" else "first_piece",
            lead_pieces=lead_pieces,
            utf8_errors=PER_BYTE_REPLACE if plan.byte_fallback else "replace",
        )

