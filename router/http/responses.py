"""POST /v1/responses (OpenAI's Responses API), over the chat path: the request becomes a chat
request (responses_schemas.py), runs as one, and its text and tool calls come back as the
Responses API's output items: a message with output_text, and function_call items. Streamed,
it is the API's typed events (response.created ... response.completed), each with its
sequence_number."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from router.http.chat import chat_params
from router.http.chat_schemas import ChatCompletionRequest
from router.http.chat_templates import render_prompt
from router.http.context import ServerContext
from router.http.errors import INTERNAL, APIError, internal_error
from router.http.generation import Choice, Generation
from router.http.logprobs import chat_logprobs
from router.http.responses_schemas import ResponsesRequest, in_responses_terms
from router.http.schemas import parse_body
from router.http.streaming import SSE_HEADERS
from router.http.tool_parser import Event, ToolCallStream, parse_calls
from router.requests import RequestError

log = logging.getLogger(__name__)

routes = APIRouter()


@routes.post("/v1/responses")
async def create_response(request: Request) -> Response:
    body = await parse_body(request, ResponsesRequest)
    ctx: ServerContext = request.app.state.ctx
    ctx.check_model(body.model)
    chat = body.as_chat()
    gen = Generation(ctx, request)
    try:
        prompt = await render_prompt(ctx, chat)
        await gen.start([prompt], 1, await chat_params(ctx, chat, len(prompt)))
    except APIError as exc:
        raise in_responses_terms(exc) from None
    except RequestError as exc:
        raise in_responses_terms(APIError.from_core(exc)) from None
    out = ResponseOutput(ctx, gen, body, chat)
    if body.stream:
        return StreamingResponse(out.events(), media_type="text/event-stream",
                                 headers=SSE_HEADERS)  # fmt: skip
    try:
        await gen.run_to_end()
        error = gen.failure()
        if error is not None:
            raise error
        return JSONResponse(out.final())
    finally:
        gen.close()


class ResponseOutput:
    def __init__(
        self, ctx: ServerContext, gen: Generation, body: ResponsesRequest,
        chat: ChatCompletionRequest,
    ):  # fmt: skip
        self.ctx = ctx
        self.gen = gen
        self.body = body
        self.chat = chat
        self.id = f"resp_{gen.request_id}"
        self.message_id = f"msg_{gen.request_id}"
        self.created = int(time.time())
        self.tools = chat.tool_mode() is not None
        self.seq = 0

    # ---- the response object ----
    def response(self, status: str, output: list[dict[str, Any]], choice: Choice | None):
        body = self.body
        incomplete = None
        if choice is not None and choice.result is not None:
            if choice.result.finish_reason.api == "length":
                status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        fmt = body.text.format if body.text is not None and body.text.format else {"type": "text"}
        tool_choice = body.tool_choice if body.tool_choice is not None else "auto"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.ctx.model_name,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "temperature": body.temperature,
            "text": {"format": fmt},
            "tool_choice": tool_choice if isinstance(tool_choice, str)
            else tool_choice.model_dump(),
            "tools": [t.model_dump() for t in body.tools or ()],
            "top_p": body.top_p,
            "truncation": "disabled",
            "usage": self.usage() if choice is not None else None,
            "user": body.user,
            "metadata": {},
        }

    def usage(self) -> dict[str, Any]:
        u = self.gen.usage()
        return {
            "input_tokens": u["prompt_tokens"],
            "input_tokens_details": u["prompt_tokens_details"],
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"],
        }

    def _logprobs(self, choice: Choice, start: int = 0, end: int | None = None):
        if not self.body.logprobs_wanted():
            return []
        sl = slice(start, end)
        top = self.chat.top_logprobs or 0
        tops = choice.top_ids[sl] if choice.top_ids else None
        top_lps = choice.top_logprobs[sl] if choice.top_logprobs else None
        return chat_logprobs(self.ctx, choice.token_ids[sl], choice.logprobs[sl], True, top,
                             tops, top_lps)["content"]  # fmt: skip

    def message_item(self, text: str, status: str, logprobs: list | None = None):
        content = []
        if status == "completed" or text:
            content = [{"type": "output_text", "text": text, "annotations": [],
                        "logprobs": logprobs or []}]  # fmt: skip
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": content}  # fmt: skip

    @staticmethod
    def call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
        return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id,
                "name": name, "arguments": arguments, "status": status}  # fmt: skip

    def final(self) -> dict[str, Any]:
        (choice,) = self.gen.choices
        text = "".join(choice.text)
        output = []
        content, calls = parse_calls(text) if self.tools else (text, [])
        if content or not calls:
            output.append(self.message_item(content, "completed", self._logprobs(choice)))
        output += [self.call_item(c.id, c.name, c.arguments, "completed") for c in calls]
        return self.response("completed", output, choice)

    # ---- streamed ----
    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    async def events(self) -> AsyncIterator[bytes]:
        gen = self.gen
        try:
            yield self._event("response.created", response=self.response("in_progress", [], None))
            yield self._event("response.in_progress",
                              response=self.response("in_progress", [], None))  # fmt: skip
            writer = _ItemWriter(self)
            parser = ToolCallStream() if self.tools else None
            async for choice, delta in gen.events():
                if delta is None:
                    error = gen.failure(choice)
                    if error is not None:
                        log.info("%s: failed while streaming: %s", gen.request_id, error.logged)
                        failed = self.response("failed", writer.output, choice)
                        failed["error"] = {"code": "server_error", "message": error.message}
                        yield self._event("response.failed", response=failed)
                        return
                    for chunk in writer.feed(parser.finish() if parser else [], choice):
                        yield chunk
                    for chunk in writer.close(choice):
                        yield chunk
                    final = self.response("completed", writer.output, choice)
                    kind = "response.incomplete" if final["status"] == "incomplete" else (
                        "response.completed"
                    )
                    yield self._event(kind, response=final)
                    return
                events = parser.feed(delta.text) if parser else [Event(content=delta.text)]
                for chunk in writer.feed(events, choice, delta):
                    yield chunk
        except Exception:  # a bug here must not leave the client hanging: report it
            log.exception("%s: internal error while streaming", gen.request_id)
            yield self._event("error", code=INTERNAL,
                              message=internal_error(gen.request_id).message, param=None)
        finally:
            gen.close()


class _ItemWriter:
    """The output items of a streamed response, opened and closed as text and calls come."""

    def __init__(self, out: ResponseOutput):
        self.out = out
        self.output: list[dict[str, Any]] = []  # closed items
        self.text: str | None = None  # the open message's text (None: no message open)
        self.text_index = -1
        self.logprobs: list[Any] = []
        self.calls: dict[int, dict[str, Any]] = {}  # call index -> its open item
        self.call_index: dict[int, int] = {}  # call index -> output index

    def _index(self) -> int:
        return len(self.output) + (self.text is not None) + len(self.calls)

    def feed(self, events: list[Event], choice: Choice, delta=None) -> list[bytes]:
        out, ev = [], self.out._event
        scored = delta is not None and delta.token_ids and self.out.body.logprobs_wanted()
        logprobs = []
        if scored:
            end = len(choice.token_ids)
            logprobs = self.out._logprobs(choice, end - len(delta.token_ids), end)
        for e in events:
            if e.content:
                if self.text is None:
                    self.text, self.text_index = "", self._index()
                    item = self.out.message_item("", "in_progress")
                    out.append(ev("response.output_item.added", output_index=self.text_index,
                                  item=item))  # fmt: skip
                    out.append(ev("response.content_part.added", item_id=self.out.message_id,
                                  output_index=self.text_index, content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": [],
                                        "logprobs": []}))  # fmt: skip
                self.text += e.content
                self.logprobs += logprobs
                out.append(ev("response.output_text.delta", item_id=self.out.message_id,
                              output_index=self.text_index, content_index=0, delta=e.content,
                              logprobs=logprobs))  # fmt: skip
                logprobs = []
            elif e.name:
                out += self._close_text()
                index = self._index()
                item = ResponseOutput.call_item(e.id, e.name, "", "in_progress")
                self.calls[e.index], self.call_index[e.index] = item, index
                out.append(ev("response.output_item.added", output_index=index, item=item))
            elif e.index in self.calls:
                item = self.calls[e.index]
                item["arguments"] += e.arguments
                at = self.call_index[e.index]
                out.append(ev("response.function_call_arguments.delta", item_id=item["id"],
                              output_index=at, delta=e.arguments))  # fmt: skip
        return out

    def _close_text(self) -> list[bytes]:
        if self.text is None:
            return []
        ev, text = self.out._event, self.text
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": self.logprobs}
        item = {**self.out.message_item(text, "completed", self.logprobs)}
        self.text = None
        self.output.append(item)
        return [
            ev("response.output_text.done", item_id=self.out.message_id,
               output_index=self.text_index, content_index=0, text=text, logprobs=self.logprobs),
            ev("response.content_part.done", item_id=self.out.message_id,
               output_index=self.text_index, content_index=0, part=part),
            ev("response.output_item.done", output_index=self.text_index, item=item),
        ]  # fmt: skip

    def close(self, choice: Choice) -> list[bytes]:
        out = self._close_text()
        ev = self.out._event
        for index in sorted(self.calls):
            item = {**self.calls[index], "status": "completed"}
            at = self.call_index[index]
            out.append(ev("response.function_call_arguments.done", item_id=item["id"],
                          output_index=at, arguments=item["arguments"]))  # fmt: skip
            out.append(ev("response.output_item.done", output_index=at, item=item))
            self.output.append(item)
        self.calls.clear()
        if not self.output:  # nothing at all was written: an empty message, as OpenAI's
            self.output.append(self.out.message_item("", "completed"))
        return out
