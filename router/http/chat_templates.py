"""A chat request's prompt: its messages (and tools) rendered by the model's chat template, or
by the request's own (vLLM's chat_template field), then tokenized."""

from __future__ import annotations

from functools import lru_cache

from router.http.chat_schemas import ChatCompletionRequest
from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.tools import template_messages, template_renders_tools, tool_dicts
from splitserve.tokenizers import ChatTemplateError
from splitserve.tokenizers.chat_template import ChatTemplate, render_chat


async def render_prompt(ctx: ServerContext, body: ChatCompletionRequest) -> list[int]:
    text = render_text(ctx, body)
    return await ctx.encode(text, add_special_tokens=body.add_special_tokens)


def render_text(ctx: ServerContext, body: ChatCompletionRequest) -> str:
    try:
        template = _template(ctx, body.chat_template)
        tools = body.tools if body.tool_mode() is not None else None
        native = template is not None and template_renders_tools(template.source)
        messages = template_messages(body.messages, tools, native)
        extra = dict(body.chat_template_kwargs or {})
        if tools and native:
            extra["tools"] = tool_dicts(tools)
        text = render_chat(template, messages, body.add_generation_prompt, **extra)
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), param="messages", code="chat_template_error") from None
    if body.continue_final_message:
        text = _open_final_message(text, messages[-1]["content"])
    return text


def _template(ctx: ServerContext, source: str | None) -> ChatTemplate | None:
    model_template = ctx.tokenizer.chat_template
    if source is None:
        return model_template
    return _compiled(source, model_template.bos_token if model_template else "",
                     model_template.eos_token if model_template else "")  # fmt: skip


@lru_cache(maxsize=16)
def _compiled(source: str, bos: str, eos: str) -> ChatTemplate:
    try:
        return ChatTemplate(source, bos, eos)
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), param="chat_template", code="chat_template_error") from None


def _open_final_message(text: str, content: str) -> str:
    """continue_final_message: the prompt ends where the final (assistant) message's content
    ends, so that the model continues it (Hugging Face's rule: cut after its last occurrence)."""
    at = text.rfind(content.rstrip()) if content.strip() else -1
    if at < 0:
        raise APIError(400, "the template does not render the final message's content verbatim,"
                       " so it cannot be continued", param="continue_final_message")  # fmt: skip
    return text[: at + len(content.rstrip())]
