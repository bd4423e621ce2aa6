"""What a client of the router core holds: its request's parameters, stream and final result."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from splitserve.protocol import FinishReason


class RequestError(Exception):
    """Base of the errors the router core raises at submit time."""

    status = 500
    kind = "internal_error"
    param: str | None = None
    code: str | None = None


class InvalidRequest(RequestError):
    """The request cannot be served as given (HTTP 400)."""

    status = 400
    kind = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


class Overloaded(RequestError):
    """Too many requests in flight and queued (HTTP 429)."""

    status = 429
    kind = "overloaded_error"

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason  # why admission refused it (router/metrics.py: REJECT_REASONS)


class NotReady(RequestError):
    """No full pipeline is ready, or the router is shutting down (HTTP 503)."""

    status = 503
    kind = "service_unavailable"


@dataclass(frozen=True)
class RequestParams:
    """Per-request generation parameters, as the router core accepts them."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logprobs: bool = False
    # logits processing (splitserve/engine/interface.py: LogitsControls); neutral values are off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    min_p: float = 0.0
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences (the HTTP layer tokenizes)
    top_logprobs: int = 0  # alternatives per sampled token (with logprobs)
    prompt_logprobs: int | None = None  # the prompt's logprobs, with this many alternatives
    grammar: str = ""  # llguidance's serialized grammar (splitserve/grammar/specs.py)


@dataclass
class Delta:
    """New output of one request: text and the tokens it came from; with top logprobs, one
    (ids, logprobs) pair of alternatives per token; the prompt's logprobs come with the first."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    prompt_logprobs: Any = None  # protocol.PromptScores
    cached_tokens: int = 0  # with the first: prompt tokens the prefill found cached


@dataclass
class Result:
    """How a request ended (finish_reason.api is the API's string: stop, length, abort, error)."""

    request_id: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    error: str = ""


@dataclass
class RequestHandle:
    """One admitted request: iterate it for deltas, then read .result (or await finished()).
    To end it early, call the core's abort(handle)."""

    request_id: str
    prompt_tokens: int
    params: RequestParams
    submitted: float  # monotonic time of submit()
    admitted: float  # monotonic time it entered the pipeline
    deadline: float
    last_progress: float = 0.0
    first_token_at: float | None = None
    # completion tokens it had when last sent to a prefill worker (a move re-prefills it from
    # there): until it has more, it waits on that prefill, which a stall must not be taken for
    prefill_from: int = 0
    # the send sequence number it was last sent to a prefill worker with, and when that worker
    # was first seen done up to it (router/liveness.py: the first-token bound)
    prefill_seq: int = 0
    prefill_cleared_at: float | None = None
    completion_tokens: int = 0
    result: Result | None = None
    # Where it runs (router/placement.py) and what a move to other workers needs: the message
    # it was sent as, every token the client has had (4 bytes each) and the text's length.
    stamp: Any = None  # Stamp
    message: Any = None  # GenerateRequest at the current epoch
    token_ids: array = field(default_factory=lambda: array("i"))
    text_chars: int = 0
    migrations: int = 0  # moves to other workers, in all
    unplanned_moves: int = 0  # of them, off workers that were not stopping: max_migrations'
    waiting_since: float | None = None  # set while no live worker can take it (a move waits)
    placed: bool = False  # counted on the workers of its stamp (router/placement.py)
    prefill_pending: bool = False  # placed on a prefill worker, first token of the epoch not in
    prefill_work: int = 0  # the tokens its prefill was counted as computing there (placement)
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    _sink: Callable[[Delta | None], None] | None = None

    def deliver_to(self, sink: Callable[[Delta | None], None]) -> None:
        """Hand every delta, then None at the end, to `sink` as it arrives, instead of to this
        handle's iterator: a consumer merging several handles (the HTTP layer's choices) then
        needs no task of its own per handle, one event-loop hop less per token."""
        while not self._queue.empty():  # whatever arrived before
            sink(self._queue.get_nowait())
        if self.result is None:  # else it has had the end (None) already: no need to keep it
            self._sink = sink

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item

    async def finished(self) -> tuple[str, Result]:
        """Consume the whole stream: (full text, result)."""
        parts = [d.text async for d in self]
        assert self.result is not None
        return "".join(parts), self.result

    @property
    def detok_index(self) -> int:
        return self.stamp.detok

    @property
    def epoch(self) -> int:
        return self.stamp.epoch

    # ---- used by the core ----
    def push(self, delta: Delta) -> None:
        now = time.monotonic()
        self.last_progress = now
        if self.first_token_at is None and delta.token_ids:
            self.first_token_at = now
        self.completion_tokens += len(delta.token_ids)
        self.token_ids.extend(delta.token_ids)
        self.text_chars += len(delta.text)
        if self._sink is not None:
            self._sink(delta)
        else:
            self._queue.put_nowait(delta)

    def end(self, finish_reason: FinishReason, error: str = "") -> None:
        if self.result is not None:
            return
        self.result = Result(
            self.request_id, finish_reason, self.prompt_tokens, self.completion_tokens, error
        )
        # The sink is done with: dropping it leaves no cycle (handle -> sink -> its consumer ->
        # handle) for the garbage collector, whose full passes stall every stream.
        sink, self._sink = self._sink, None
        if sink is not None:
            sink(None)
        else:
            self._queue.put_nowait(None)
