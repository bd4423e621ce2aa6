"""POST /v1/completions: one or several prompts (text or token ids), n choices each, streamed or
not, with logprobs of the sampled tokens."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.http import limits
from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.generation import Choice, Generation
from router.http.logprobs import completion_logprobs
from router.http.schemas import CompletionRequest, parse_body
from router.http.streaming import respond
from router.requests import Delta

routes = APIRouter()


@routes.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    body = await parse_body(request, CompletionRequest)
    ctx: ServerContext = request.app.state.ctx
    ctx.check_model(body.model)
    prompts = body.prompts()
    if len(prompts) * body.n > limits.MAX_CHOICES:
        raise APIError(400, f"prompts x n must be at most {limits.MAX_CHOICES}", param="n")
    token_prompts = [p if isinstance(p, list) else await ctx.encode(p) for p in prompts]
    params = body.to_params(body.max_tokens or 16, body.logprobs is not None)
    gen = Generation(ctx, request)
    await gen.start(token_prompts, body.n, params)
    fmt = CompletionFormat(ctx, gen, body)
    return await respond(gen, fmt, body.stream, body.stream_options)


class CompletionFormat:
    def __init__(self, ctx: ServerContext, gen: Generation, body: CompletionRequest):
        self.ctx = ctx
        self.gen = gen
        self.body = body
        self.id = f"cmpl-{gen.request_id}"
        self.created = int(time.time())
        self.offsets = [0] * len(gen.choices)  # where each choice's next token starts, in chars

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
        }

    def _logprobs(self, choice: Choice, token_ids: list[int], logprobs: list[float]):
        if self.body.logprobs is None:
            return None
        out = completion_logprobs(
            self.ctx, token_ids, logprobs, self.body.skip_special_tokens, self.body.logprobs,
            self.offsets[choice.index],
        )  # fmt: skip
        if out["tokens"]:
            self.offsets[choice.index] = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

    # ---- streamed ----
    def text_only(self) -> bool:
        return self.body.logprobs is None

    def opening_chunks(self) -> list[dict[str, Any]]:
        return []

    def delta_chunk(self, choice: Choice, delta: Delta) -> dict[str, Any] | None:
        if not delta.text and not (self.body.logprobs is not None and delta.token_ids):
            return None
        item = {
            "index": choice.index,
            "text": delta.text,
            "logprobs": self._logprobs(choice, delta.token_ids, delta.logprobs),
            "finish_reason": None,
        }
        return self._chunk([item])

    def finish_chunk(self, choice: Choice) -> dict[str, Any]:
        assert choice.result is not None
        item = {"index": choice.index, "text": "", "logprobs": None,
                "finish_reason": choice.result.finish_reason.api}  # fmt: skip
        return self._chunk([item])

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._chunk([]), "usage": usage}

    # ---- not streamed ----
    def response(self) -> dict[str, Any]:
        items = []
        for c in self.gen.choices:
            assert c.result is not None
            items.append({
                "index": c.index,
                "text": "".join(c.text),
                "logprobs": self._logprobs(c, c.token_ids, c.logprobs),
                "finish_reason": c.result.finish_reason.api,
            })  # fmt: skip
        return {**self._chunk(items), "usage": self.gen.usage()}
