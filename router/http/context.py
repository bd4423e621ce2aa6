"""What every endpoint shares: the router core, the tokenizer, the served model's name, and the
HTTP request ids in flight."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from router.core import RouterCore
from router.http.errors import APIError
from splitserve.config import ClusterConfig
from splitserve.tokenizers import Tokenizer

# Tokenizing a long text takes a while: off the event loop, so that running streams keep flowing.
ENCODE_INLINE_CHARS = 16_384


def served_model_name(config: ClusterConfig) -> str:
    if config.router.model_name:
        return config.router.model_name
    path = config.model.path
    if path == "default":
        from splitserve.engine.default_model import DEFAULT_MODEL_FILE

        return DEFAULT_MODEL_FILE
    return os.path.basename(path.rstrip("/")) or path


class CoreIds:
    """The core request ids in use or recently used. Workers remember a finished request's id for
    lifecycle.state_ttl_s and drop whatever arrives for it, so a client that reuses its
    X-Request-Id within that time gets a fresh suffix on the core's ids (`<id>.<hex>`), still
    findable in the logs by the client's id."""

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self.in_use: set[str] = set()
        self.released: OrderedDict[str, float] = OrderedDict()  # id -> when it ended, oldest first

    def claim(self, base: str, count: int) -> list[str]:
        self._prune()
        ids = self._ids(base, count)
        if any(i in self.in_use or i in self.released for i in ids):
            ids = self._ids(f"{base}.{uuid.uuid4().hex[:8]}", count)
        self.in_use.update(ids)
        return ids

    def release(self, ids: list[str]) -> None:
        now = time.monotonic()
        for i in ids:
            if i in self.in_use:
                self.in_use.discard(i)
                self.released[i] = now

    @staticmethod
    def _ids(base: str, count: int) -> list[str]:
        return [base] if count == 1 else [f"{base}-{i}" for i in range(count)]

    def _prune(self) -> None:
        horizon = time.monotonic() - self.ttl_s
        while self.released:
            rid, when = next(iter(self.released.items()))
            if when > horizon:
                break
            self.released.popitem(last=False)


@dataclass
class ServerContext:
    core: RouterCore
    tokenizer: Tokenizer
    config: ClusterConfig
    model_name: str
    created: int = field(default_factory=lambda: int(time.time()))
    in_flight: set[str] = field(default_factory=set)  # HTTP request ids with requests running
    core_ids: CoreIds = field(init=False)
    _pieces: tuple[bytes, ...] | None = None
    _special: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        # a margin past the workers' memory, for messages still in flight when a request ended
        self.core_ids = CoreIds(self.config.lifecycle.state_ttl_s + 5.0)

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.model_name, self.config.model.path):
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
