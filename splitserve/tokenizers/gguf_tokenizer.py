"""The vocabulary embedded in a GGUF file, without llama.cpp.

- tokenizer.ggml.model == "gpt2": byte-level BPE from tokens + merges, rebuilt as a Hugging Face
  `tokenizers` model (HFTokenizer) with the pre-tokenizer that tokenizer.ggml.pre names (SmolLM2's
  "smollm": every digit alone, then GPT-2's byte-level regex, as its tokenizer.json does).
- tokenizer.ggml.model == "llama": SentencePiece BPE from tokens + scores + token types, rebuilt
  as a SentencePiece ModelProto (identity normalizer, "▁" for space, <0xNN> byte fallback).

Token types (GGUF numbering, the same as SentencePiece's): 1 normal, 2 unknown, 3 control,
4 user-defined, 5 unused, 6 byte. Control tokens are special; user-defined ones are plain text.
The metadata comes from splitserve.gguf_header (only the key/value header), which is much faster
than parsing the whole file with gguf.GGUFReader.
"""

from __future__ import annotations

import logging

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from splitserve.gguf_header import GGUFFormatError, read_metadata
from splitserve.tokenizers.base import Tokenizer
from splitserve.tokenizers.hf_tokenizer import HFTokenizer
from splitserve.tokenizers.sentencepiece_tokenizer import (
    SentencePieceTokenizer,
    build_model_proto,
)

log = logging.getLogger(__name__)

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = range(
    1, 7
)

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_GPT2 = {"default", "gpt2", "gpt-2", "olmo", "jais", "poro-chat", "viking", "mpt", "stablelm2"}


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = {"llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT,
             "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT,
             "deepseek-r1-qwen": _QWEN2_SPLIT}.get(pre)  # fmt: skip
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre not in _GPT2:
        log.warning("GGUF pre-tokenizer %r not known; using GPT-2's byte-level split", pre)
    return byte_level


def _build_byte_level_bpe(meta: dict) -> tokenizers.Tokenizer:
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    pre = meta.get("tokenizer.ggml.pre", "default")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFFormatError("GGUF vocabulary has duplicate tokens")
    model = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in ("llama3", "llama-bpe"))
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(tokens[i], special=types[i] == TOKEN_CONTROL, normalized=False)
        for i in range(len(tokens))
        if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])
    return tok


def _eos_ids(meta: dict) -> list[int]:
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    return [meta[f"tokenizer.ggml.{k}"] for k in keys if f"tokenizer.ggml.{k}" in meta]


def tokenizer_from_gguf_metadata(meta: dict) -> Tokenizer:
    """Build the tokenizer a GGUF file's tokenizer.* metadata describes."""
    kind = meta.get("tokenizer.ggml.model")
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    template = meta.get("tokenizer.chat_template")
    if kind == "gpt2":
        return HFTokenizer(
            _build_byte_level_bpe(meta),
            bos_id=bos_id,
            eos_ids=_eos_ids(meta),
            chat_template=template,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        )
    if kind == "llama":
        tokens = meta["tokenizer.ggml.tokens"]
        scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
        proto = build_model_proto(
            tokens,
            scores,
            types,
            add_dummy_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
        )
        return SentencePieceTokenizer(
            proto,
            bos_id=bos_id,
            eos_ids=_eos_ids(meta),
            chat_template=template,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        )
    raise GGUFFormatError(f"GGUF tokenizer model {kind!r} not supported (gpt2 and llama are)")


def load_gguf_tokenizer(path: str) -> Tokenizer:
    return tokenizer_from_gguf_metadata(read_metadata(path))
