"""POST /v1/chat/completions: messages (and tools) rendered with the model's own chat template,
then the same path as a completion; n choices, streamed (role first, then content or tool
calls) or not. The output is constrained by the grammar of response_format / structured
outputs, or by the tool-call grammar when tool_choice requires a call (tools.py)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.http.chat_schemas import ChatCompletionRequest
from router.http.chat_templates import render_prompt
from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.generation import Choice, Generation
from router.http.logprobs import chat_logprobs, prompt_logprobs
from router.http.request_params import core_params
from router.http.schemas import parse_body
from router.http.streaming import respond
from router.http.structured import output_grammar, output_spec, spec_error
from router.http.tool_parser import Event, ToolCallStream, parse_calls
from router.http.tools import call_grammar
from router.requests import Delta
from splitserve.grammar.matcher import GrammarError

routes = APIRouter()


@routes.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    ctx: ServerContext = request.app.state.ctx
    ctx.check_model(body.model)
    prompt = await render_prompt(ctx, body)
    params = await chat_params(ctx, body, len(prompt))
    gen = Generation(ctx, request)
    await gen.start([prompt], body.n, params)
    fmt = ChatFormat(ctx, gen, body, prompt)
    return await respond(gen, fmt, body.stream, body.stream_options)


async def chat_params(ctx: ServerContext, body: ChatCompletionRequest, prompt_tokens: int):
    mode = body.tool_mode()
    if mode is not None and mode != "auto":  # a call is required: constrain it
        if output_spec(body) is not None:
            raise APIError(400, "a required tool call and response_format cannot both shape"
                           " the output", param="tool_choice")  # fmt: skip
        assert body.tools is not None
        try:
            spec = call_grammar(body.tools, None if mode == "required" else mode,
                                body.parallel())  # fmt: skip
        except GrammarError as exc:
            raise spec_error("tools", exc) from None
        grammar = await ctx.contained.grammar(spec, "tools")
    else:
        grammar = await output_grammar(ctx, body)
    top = (body.top_logprobs or 0) if body.logprobs else 0
    return core_params(ctx, body, prompt_tokens, body.output_tokens(), bool(body.logprobs), top,
                       grammar)  # fmt: skip


def tool_calls_json(calls) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


class ChatFormat:
    def __init__(
        self, ctx: ServerContext, gen: Generation, body: ChatCompletionRequest, prompt: list[int]
    ):
        self.ctx = ctx
        self.gen = gen
        self.body = body
        self.prompt = prompt
        self.id = f"chatcmpl-{gen.request_id}"
        self.created = int(time.time())
        self.tools = body.tool_mode() is not None
        self.parsers = {c.index: ToolCallStream() for c in gen.choices} if self.tools else {}

    def _chunk(self, choices: list[dict[str, Any]], obj: str = "chat.completion.chunk"):
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
        }

    def _logprobs(self, token_ids, logprobs, top_ids=None, top_logprobs=None):
        if not self.body.logprobs:
            return None
        top = self.body.top_logprobs or 0
        return chat_logprobs(self.ctx, token_ids, logprobs, self.body.skip_special_tokens, top,
                             top_ids, top_logprobs)  # fmt: skip

    @staticmethod
    def _item(index: int, delta: dict, logprobs=None, finish: str | None = None):
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def finish_reason(self, choice: Choice) -> str:
        assert choice.result is not None
        reason = choice.result.finish_reason.api
        parser = self.parsers.get(choice.index)
        return "tool_calls" if reason == "stop" and parser is not None and parser.calls else reason

    # ---- streamed ----
    def text_only(self) -> bool:
        return not self.body.logprobs and not self.tools

    def opening_chunks(self) -> list[dict[str, Any]]:
        role = {"role": "assistant", "content": ""}
        return [self._chunk([self._item(c.index, role)]) for c in self.gen.choices]

    def delta_chunk(self, choice: Choice, delta: Delta) -> dict[str, Any] | None:
        scored = self.body.logprobs and delta.token_ids
        if self.tools:  # text that may be a call is held back: the delta may be empty
            message = self._tool_delta(self.parsers[choice.index].feed(delta.text))
        else:
            message = {"content": delta.text} if delta.text or scored else {}
        if not message and not scored:
            return None
        logprobs = self._logprobs(delta.token_ids, delta.logprobs, delta.top_ids,
                                  delta.top_logprobs)  # fmt: skip
        return self._chunk([self._item(choice.index, message, logprobs)])

    def closing_chunks(self, choice: Choice) -> list[dict[str, Any]]:
        """What a tool-call parser held back, before the finishing chunk."""
        parser = self.parsers.get(choice.index)
        message = self._tool_delta(parser.finish()) if parser is not None else {}
        return [self._chunk([self._item(choice.index, message)])] if message else []

    @staticmethod
    def _tool_delta(events: list[Event]) -> dict[str, Any]:
        message: dict[str, Any] = {}
        content = "".join(e.content for e in events)
        if content:
            message["content"] = content
        calls = []
        for e in events:
            if e.index < 0:
                continue
            if e.name:
                calls.append({"index": e.index, "id": e.id, "type": "function",
                              "function": {"name": e.name, "arguments": ""}})  # fmt: skip
            else:
                calls.append({"index": e.index, "function": {"arguments": e.arguments}})
        if calls:
            message["tool_calls"] = calls
        return message

    def finish_chunk(self, choice: Choice) -> dict[str, Any]:
        return self._chunk([self._item(choice.index, {}, None, self.finish_reason(choice))])

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._chunk([]), "usage": usage}

    # ---- not streamed ----
    def response(self) -> dict[str, Any]:
        items = []
        for c in self.gen.choices:
            assert c.result is not None
            text = "".join(c.text)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.tools:
                content, calls = parse_calls(text)
                self.parsers[c.index].calls = calls
                if calls:
                    message = {"role": "assistant", "content": content or None,
                               "tool_calls": tool_calls_json(calls)}  # fmt: skip
            items.append({
                "index": c.index,
                "message": message,
                "logprobs": self._logprobs(c.token_ids, c.logprobs, c.top_ids, c.top_logprobs),
                "finish_reason": self.finish_reason(c),
            })  # fmt: skip
        out = {**self._chunk(items, "chat.completion"), "usage": self.gen.usage()}
        if self.body.prompt_logprobs is not None:
            out["prompt_logprobs"] = prompt_logprobs(
                self.ctx, self.prompt, self.gen.choices[0].prompt_scores
            )
        return out
