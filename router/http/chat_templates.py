"""A chat request's prompt: its messages (and tools) rendered by the model's chat template, or
by the request's own (vLLM's chat_template field), then tokenized.

A request's own template is a program the client wrote (nested loops run as long as they
like), so it is refused unless the operator allows it ([router] trust_request_chat_template,
--trust-request-chat-template, as vLLM's flag); when allowed, it compiles and renders only in
a contained child under a time limit (router/http/contained.py). The model's own template is
the operator's: a small chat renders here at once, a large one (its cost grows with what the
client sent) in the contained child as well, so that neither stalls the event loop.
"""

from __future__ import annotations

import json
from typing import Any

from router.http.chat_schemas import ChatCompletionRequest
from router.http.contained import RenderJob
from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.tools import template_messages, template_renders_tools, tool_dicts
from splitserve.tokenizers import ChatTemplateError
from splitserve.tokenizers.chat_template import render_chat

# a chat this small renders in well under a millisecond: here, not worth a round trip
RENDER_INLINE_CHARS = 16_384
RENDER_INLINE_MESSAGES = 64


async def render_prompt(ctx: ServerContext, body: ChatCompletionRequest) -> list[int]:
    text = await render_text(ctx, body)
    return await ctx.encode(text, add_special_tokens=body.add_special_tokens)


async def render_text(ctx: ServerContext, body: ChatCompletionRequest) -> str:
    own = body.chat_template
    if own is not None and not ctx.config.router.trust_request_chat_template:
        raise APIError(400, "chat_template: this server does not run a request's own chat"
                       " template (its operator may allow it with"
                       " --trust-request-chat-template)", param="chat_template",
                       code="chat_template_not_allowed")  # fmt: skip
    model = ctx.tokenizer.chat_template
    source = own if own is not None else model.source if model is not None else None
    tools = body.tools if body.tool_mode() is not None else None
    native = source is not None and template_renders_tools(source)
    messages = template_messages(body.messages, tools, native)
    extra = dict(body.chat_template_kwargs or {})
    if tools and native:
        extra["tools"] = tool_dicts(tools)
    if source is None or (own is None and _small(messages, extra)):
        try:
            text = render_chat(model, messages, body.add_generation_prompt, **extra)
        except ChatTemplateError as exc:
            raise APIError(400, str(exc), param="messages", code="chat_template_error") from None
    else:
        bos, eos = (model.bos_token, model.eos_token) if model is not None else ("", "")
        job = RenderJob(source, bos, eos, messages, body.add_generation_prompt, extra,
                        own=own is not None)  # fmt: skip
        text = await ctx.contained.render(job)
    if body.continue_final_message:
        text = _open_final_message(text, messages[-1]["content"])
    return text


def _small(messages: list[dict[str, Any]], extra: dict[str, Any]) -> bool:
    if len(messages) > RENDER_INLINE_MESSAGES:
        return False
    size = sum(len(str(m.get("content", ""))) for m in messages)
    return size + (len(json.dumps(extra, default=str)) if extra else 0) <= RENDER_INLINE_CHARS


def _open_final_message(text: str, content: str) -> str:
    """continue_final_message: the prompt ends where the final (assistant) message's content
    ends, so that the model continues it (Hugging Face's rule: cut after its last occurrence)."""
    at = text.rfind(content.rstrip()) if content.strip() else -1
    if at < 0:
        raise APIError(400, "the template does not render the final message's content verbatim,"
                       " so it cannot be continued", param="continue_final_message")  # fmt: skip
    return text[: at + len(content.rstrip())]
