"""Tokenizers behind one interface: SentencePiece, Hugging Face tokenizer.json, GGUF vocabularies.

load_tokenizer(path) picks the kind from the path:
- a .gguf file: the vocabulary in its metadata (gguf_tokenizer.py);
- a tokenizer.json (or any .json), or a folder holding one: Hugging Face `tokenizers`, with
  tokenizer_config.json beside it for the chat template, bos/eos and special tokens;
- a tokenizer.model (or any .model), or a folder holding one: SentencePiece.
"""

from __future__ import annotations

import os

from splitserve.tokenizers.base import Tokenizer, TokenTable
from splitserve.tokenizers.chat_template import ChatTemplateError, NoChatTemplateError

__all__ = [
    "ChatTemplateError",
    "NoChatTemplateError",
    "TokenTable",
    "Tokenizer",
    "load_tokenizer",
]


def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer at path (see the module docstring); FileNotFoundError/ValueError if none."""
    if os.path.isdir(path):
        for name in ("tokenizer.json", "tokenizer.model"):
            if os.path.isfile(os.path.join(path, name)):
                return load_tokenizer(os.path.join(path, name))
        raise FileNotFoundError(f"no tokenizer.json or tokenizer.model in {path}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokenizer not found: {path}")
    if path.endswith(".gguf"):
        from splitserve.tokenizers.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    if path.endswith(".json"):
        from splitserve.tokenizers.hf_tokenizer import HFTokenizer

        return HFTokenizer.from_file(path)
    if path.endswith(".model"):
        from splitserve.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

        return SentencePieceTokenizer.from_file(path)
    raise ValueError(f"unknown tokenizer kind: {path} (want .gguf, tokenizer.json or .model)")
