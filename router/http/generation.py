"""The core requests behind one HTTP request: one per choice, submitted together, their deltas
merged into one stream, and all of them aborted together when the client goes away.

A Generation watches the connection from the moment it submits: a client that disconnects while
its requests are queued, running or streaming gets them aborted, which frees their slots at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from fastapi import Request

from router.http.context import ServerContext
from router.http.errors import APIError, ClientGone, internal_error
from router.requests import Delta, RequestHandle, RequestParams, Result
from splitserve.protocol import FinishReason
from splitserve.protocol.params import MAX_SEED

log = logging.getLogger(__name__)


@dataclass
class Choice:
    """One sampled output: its core request and everything it produced so far."""

    index: int
    prompt_index: int
    handle: RequestHandle
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)  # alternatives, when asked for
    top_logprobs: list[list[float]] = field(default_factory=list)
    prompt_scores: Any = None  # protocol.PromptScores, when prompt logprobs were asked for
    cached_tokens: int = 0  # prompt tokens its prefill took from the prefix cache

    @property
    def result(self) -> Result | None:
        return self.handle.result

    def add(self, delta: Delta) -> None:
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        if delta.top_ids:
            self.top_ids.extend(delta.top_ids)
            self.top_logprobs.extend(delta.top_logprobs)
        if delta.prompt_logprobs is not None:
            self.prompt_scores = delta.prompt_logprobs
        if delta.cached_tokens:
            self.cached_tokens = delta.cached_tokens


class Generation:
    def __init__(self, ctx: ServerContext, request: Request):
        self.ctx = ctx
        self.request = request
        self.request_id: str = request.state.request_id
        self.choices: list[Choice] = []
        self.prompt_tokens = 0
        self._events: asyncio.Queue[tuple[Choice, Delta | None]] = asyncio.Queue()
        self._registered = False
        self._core_ids: list[str] = []
        self._watch: asyncio.Task | None = None

    # ---- starting ----
    async def start(
        self, prompts: list[list[int]], n: int, params: RequestParams | list[RequestParams]
    ) -> None:
        """Submit n requests per prompt (params: the same for all, or one per prompt); raises
        APIError / RequestError (nothing left running)."""
        if not isinstance(params, list):
            params = [params] * len(prompts)
        self._core_ids = self.ctx.core.requests.claim(self.request_id, len(prompts) * n)
        self._registered = True
        self.prompt_tokens = sum(len(p) for p in prompts)
        self._watch = asyncio.create_task(self._watch_client(), name=f"watch-{self.request_id}")
        submit = asyncio.create_task(self._submit_all(prompts, n, params))
        try:
            await asyncio.wait({submit, self._watch}, return_when=asyncio.FIRST_COMPLETED)
            if not submit.done():  # the client left while its requests waited for admission
                submit.cancel()
                await asyncio.gather(submit, return_exceptions=True)
                raise ClientGone()
            submit.result()
        except BaseException:
            self.close()
            raise
        for c in self.choices:
            c.handle.deliver_to(partial(self._deliver, c))

    async def _submit_all(
        self, prompts: list[list[int]], n: int, all_params: list[RequestParams]
    ) -> None:
        try:
            for p, prompt in enumerate(prompts):
                params = all_params[p]
                for j in range(n):
                    i = p * n + j
                    rid = self._core_ids[i]
                    choice_params = params
                    if params.seed is not None and j:  # n samples of one seed must differ
                        choice_params = replace(params, seed=(params.seed + j) % (MAX_SEED + 1))
                    handle = await self.ctx.core.submit(
                        prompt, choice_params, request_id=rid, claimed=True
                    )
                    self.choices.append(Choice(i, p, handle))
        except BaseException:
            self.abort()
            raise

    def _deliver(self, choice: Choice, delta: Delta | None) -> None:
        self._events.put_nowait((choice, delta))

    async def _watch_client(self) -> None:
        """Returns when the connection closes (or the response is complete): abort what runs."""
        receive = self.request.receive
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
            if any(c.result is None for c in self.choices):
                log.info("%s: client disconnected: aborting", self.request_id)
        finally:
            # the aborted requests' ends still reach a stream that is reading (see _deliver)
            self.abort()
            self._forget()

    # ---- consuming ----
    async def events(self) -> AsyncIterator[tuple[Choice, Delta | None]]:
        """Every choice's deltas as they come, then (choice, None) once per finished choice."""
        remaining = len(self.choices)
        while remaining:
            choice, delta = await self._events.get()
            if delta is None:
                remaining -= 1
            else:
                choice.add(delta)
            yield choice, delta

    async def run_to_end(self) -> None:
        async for _ in self.events():
            pass

    def failure(self, choice: Choice | None = None) -> APIError | None:
        """The error a failed choice (or the first failed one) must be reported as: the
        reason (a worker's message may hold its grammar state and the request's schema) is
        for the log only."""
        for c in [choice] if choice is not None else self.choices:
            r = c.result
            if r is not None and r.finish_reason == FinishReason.ERROR:
                return internal_error(self.request_id, r.error or "the request failed")
            if r is not None and r.finish_reason == FinishReason.ABORT:
                return APIError(500, "the request was aborted", "internal_error")
        return None

    def usage(self) -> dict[str, Any]:
        completion = sum(len(c.token_ids) for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens()},
        }

    def cached_tokens(self) -> int:
        """Per prompt, its first choice's cached tokens (prompt_tokens counts each prompt once,
        though each choice ran its own prefill)."""
        first: dict[int, int] = {}
        for c in self.choices:
            first.setdefault(c.prompt_index, c.cached_tokens)
        return sum(first.values())

    # ---- ending ----
    def abort(self) -> None:
        for c in self.choices:
            self.ctx.core.abort(c.handle)

    def close(self) -> None:
        """Abort what still runs and forget the request; safe to call twice."""
        self.abort()
        self.request.state.usage = self.usage()  # for the access log (a copy: no cycle)
        watch, self._watch = self._watch, None
        if watch is not None and watch is not asyncio.current_task():
            # without the reference, the cancelled task's error (whose traceback holds the
            # watcher's frame, and so this object) forms no cycle the garbage collector must
            # find: its full passes stall every stream
            watch.cancel()
        self._forget()

    def _forget(self) -> None:
        if self._registered:
            self.ctx.core.requests.release(self.request_id, self._core_ids)
            self._registered = False
