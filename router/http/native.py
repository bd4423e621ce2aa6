"""POST /generate: the native endpoint. One prompt as text or token ids in; text and token ids out
(and logprobs when asked), streamed as SSE or in one JSON object."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.http.context import ServerContext
from router.http.generation import Choice, Generation
from router.http.request_params import core_params
from router.http.schemas import GenerateRequestBody, parse_body
from router.http.streaming import respond
from router.http.structured import output_grammar
from router.requests import Delta

routes = APIRouter()


@routes.post("/generate")
async def generate(request: Request) -> Response:
    body = await parse_body(request, GenerateRequestBody)
    ctx: ServerContext = request.app.state.ctx
    ctx.check_model(body.model)
    if body.prompt_token_ids is not None:
        prompt = list(body.prompt_token_ids)
    else:
        prompt = await ctx.encode(body.prompt or "", body.add_special_tokens)
    grammar = await output_grammar(ctx, body)
    gen = Generation(ctx, request)
    params = core_params(ctx, body, len(prompt), body.max_tokens, body.logprobs, 0, grammar)
    await gen.start([prompt], 1, params)
    fmt = NativeFormat(gen, body.logprobs)
    return await respond(gen, fmt, body.stream, body.stream_options)


class NativeFormat:
    def __init__(self, gen: Generation, logprobs: bool):
        self.gen = gen
        self.logprobs = logprobs

    def _item(self, text: str, token_ids: list[int], logprobs: list[float], finish: str | None):
        item: dict[str, Any] = {
            "id": self.gen.request_id,
            "text": text,
            "token_ids": token_ids,
            "finish_reason": finish,
        }
        if self.logprobs:
            item["logprobs"] = logprobs
        return item

    def text_only(self) -> bool:
        return False  # its chunks carry the token ids too

    def opening_chunks(self) -> list[dict[str, Any]]:
        return []

    def delta_chunk(self, choice: Choice, delta: Delta) -> dict[str, Any] | None:
        if not delta.text and not delta.token_ids:
            return None
        return self._item(delta.text, delta.token_ids, delta.logprobs, None)

    def finish_chunk(self, choice: Choice) -> dict[str, Any]:
        assert choice.result is not None
        item = self._item("", [], [], choice.result.finish_reason.api)
        return {**item, "usage": self.gen.usage()}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.gen.request_id, "usage": usage}

    def response(self) -> dict[str, Any]:
        (c,) = self.gen.choices
        assert c.result is not None
        item = self._item("".join(c.text), c.token_ids, c.logprobs, c.result.finish_reason.api)
        return {**item, "usage": self.gen.usage()}
