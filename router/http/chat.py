"""POST /v1/chat/completions: messages rendered with the model's own chat template, then the same
path as a completion; n choices, streamed (role first, then content) or not."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.generation import Choice, Generation
from router.http.logprobs import chat_logprobs
from router.http.schemas import ChatCompletionRequest, parse_body
from router.http.streaming import respond
from router.requests import Delta
from splitserve.tokenizers import ChatTemplateError

routes = APIRouter()


@routes.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    ctx: ServerContext = request.app.state.ctx
    ctx.check_model(body.model)
    messages = [m.for_template() for m in body.messages]
    try:
        text = ctx.tokenizer.apply_chat_template(messages, body.add_generation_prompt)
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), param="messages", code="chat_template_error") from None
    prompt = await ctx.encode(text, add_special_tokens=False)  # the template wrote the specials
    max_tokens = body.max_completion_tokens or body.max_tokens or ctx.config.model.max_seq_len
    params = body.to_params(max_tokens, bool(body.logprobs))  # the core clamps to the context
    gen = Generation(ctx, request)
    await gen.start([prompt], body.n, params)
    fmt = ChatFormat(ctx, gen, body)
    return await respond(gen, fmt, body.stream, body.stream_options)


class ChatFormat:
    def __init__(self, ctx: ServerContext, gen: Generation, body: ChatCompletionRequest):
        self.ctx = ctx
        self.gen = gen
        self.body = body
        self.id = f"chatcmpl-{gen.request_id}"
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], obj: str = "chat.completion.chunk"):
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
        }

    def _logprobs(self, token_ids: list[int], logprobs: list[float]):
        if not self.body.logprobs:
            return None
        top = self.body.top_logprobs or 0
        return chat_logprobs(self.ctx, token_ids, logprobs, self.body.skip_special_tokens, top)

    @staticmethod
    def _item(index: int, delta: dict, logprobs=None, finish: str | None = None):
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    # ---- streamed ----
    def text_only(self) -> bool:
        return not self.body.logprobs

    def opening_chunks(self) -> list[dict[str, Any]]:
        role = {"role": "assistant", "content": ""}
        return [self._chunk([self._item(c.index, role)]) for c in self.gen.choices]

    def delta_chunk(self, choice: Choice, delta: Delta) -> dict[str, Any] | None:
        if not delta.text and not (self.body.logprobs and delta.token_ids):
            return None
        logprobs = self._logprobs(delta.token_ids, delta.logprobs)
        return self._chunk([self._item(choice.index, {"content": delta.text}, logprobs)])

    def finish_chunk(self, choice: Choice) -> dict[str, Any]:
        assert choice.result is not None
        return self._chunk([self._item(choice.index, {}, None, choice.result.finish_reason.api)])

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._chunk([]), "usage": usage}

    # ---- not streamed ----
    def response(self) -> dict[str, Any]:
        items = []
        for c in self.gen.choices:
            assert c.result is not None
            items.append({
                "index": c.index,
                "message": {"role": "assistant", "content": "".join(c.text)},
                "logprobs": self._logprobs(c.token_ids, c.logprobs),
                "finish_reason": c.result.finish_reason.api,
            })  # fmt: skip
        return {**self._chunk(items, "chat.completion"), "usage": self.gen.usage()}
