"""The grammar engine's view of a vocabulary: llguidance's LLTokenizer, built from the model's
own token byte table (TokenTable.pieces: the exact bytes each token adds to the output)."""

from __future__ import annotations

from concurrent.futures import Future
from threading import Thread

import llguidance

from splitserve.tokenizers.base import Tokenizer


class _TableTokenizer:
    """What llguidance.TokenizerWrapper reads: per-id bytes, special ids, eos/bos, and an
    encoder (used only to tokenize literal text in a grammar)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        table = tokenizer.token_table()
        pieces = list(table.pieces)
        pieces += [b""] * (vocab_size - len(pieces))  # an engine's padding ids: never allowed
        self.tokens = pieces
        self.special_token_ids = sorted(table.special_ids)
        eos = sorted(tokenizer.eos_ids)
        self.eos_token_id = eos[0] if eos else 0
        self.bos_token_id = tokenizer.bos_id
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tokenizer.encode(text, add_special_tokens=False)


def grammar_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's tokenizer over `vocab_size` ids (the engine's, which may exceed the
    tokenizer's); every end-of-generation id of the tokenizer ends a completed grammar.
    Takes about half a second for a 49,152-token vocabulary."""
    wrapper = llguidance.TokenizerWrapper(_TableTokenizer(tokenizer, vocab_size))
    eos = sorted(tokenizer.eos_ids) or None
    return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos)


def build_in_background(load, vocab_size: int) -> Future:
    """A Future of grammar_tokenizer(load(), vocab_size), built on a thread of its own: a worker
    starts it at setup and waits for it only when the first grammar comes."""
    future: Future = Future()

    def build() -> None:
        try:
            future.set_result(grammar_tokenizer(load(), vocab_size))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            future.set_exception(exc)

    Thread(target=build, name="grammar-vocabulary", daemon=True).start()
    return future


def ready(vocabulary: Future) -> llguidance.LLTokenizer:
    """The built vocabulary (waiting for it); GrammarError when it could not be built, so that
    the request fails and the worker goes on."""
    from splitserve.grammar.matcher import GrammarError

    try:
        return vocabulary.result()
    except Exception as exc:  # noqa: BLE001 - whatever the build raised
        raise GrammarError(f"this worker cannot build grammars for its vocabulary: {exc}") from None


def for_model(model, vocab_size: int) -> Future:
    """The grammar vocabulary of a worker's model (a ModelConfig), built in the background."""
    from splitserve.tokenizer_path import tokenizer_path
    from splitserve.tokenizers import load_tokenizer

    return build_in_background(lambda: load_tokenizer(tokenizer_path(model)), vocab_size)
