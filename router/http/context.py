"""What every endpoint shares: the router core, the tokenizer, the served model's names, and the
contained children that compile clients' grammars and render their templates (for the app's
life: closed when the router stops). (The HTTP request ids in flight are the core's request
table's: see router/request_table.py.)"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from router.contained.pool import ContainedPool
from router.core import RouterCore
from router.http.contained import ContainedWork
from router.http.errors import APIError
from splitserve.config import ClusterConfig
from splitserve.model_names import accepted_names, served_names
from splitserve.tokenizer_path import tokenizer_path
from splitserve.tokenizers import Tokenizer

# Tokenizing a long text takes a while: off the event loop, so that running streams keep flowing.
ENCODE_INLINE_CHARS = 16_384


@dataclass
class ServerContext:
    """model_name: the first served name, which responses carry; names: every served name
    (/v1/models); accepted: what a request's `model` may be (splitserve/model_names.py)."""

    core: RouterCore
    tokenizer: Tokenizer
    config: ClusterConfig
    names: tuple[str, ...] = ()
    accepted: frozenset[str] = frozenset()
    contained: ContainedWork = field(init=False, repr=False)
    created: int = field(default_factory=lambda: int(time.time()))
    _pieces: tuple[bytes, ...] | None = None
    _special: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        self.names = self.names or served_names(self.config)
        self.accepted = self.accepted or accepted_names(self.config)
        vocabulary = (tokenizer_path(self.config.model), self.tokenizer.vocab_size)
        self.contained = ContainedWork(ContainedPool(vocabulary=vocabulary))

    async def close(self) -> None:
        await self.contained.close()

    @property
    def model_name(self) -> str:
        return self.names[0]

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.accepted:
            raise APIError(
                400,
                f"model {model!r} is not served here; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) <= ENCODE_INLINE_CHARS:
            return self.tokenizer.encode(text, add_special_tokens)
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)

    def token_bytes(self, token: int, skip_special_tokens: bool) -> bytes:
        """What one token contributes to the output, for logprobs (its own piece, in isolation)."""
        if self._pieces is None:
            table = self.tokenizer.token_table()
            self._pieces, self._special = table.pieces, table.special_ids
        if skip_special_tokens and token in self._special:
            return b""
        return self._pieces[token] if 0 <= token < len(self._pieces) else b""
