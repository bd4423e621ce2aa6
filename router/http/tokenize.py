"""POST /tokenize and POST /detokenize, as vLLM serves them: a prompt (or chat messages,
rendered by the chat template as /v1/chat/completions would) into token ids, and back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from router.http.chat_schemas import ChatMessage, NamedToolChoice, Tool
from router.http.chat_templates import render_text
from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.schemas import NONE, RefusingModel, TokenId, parse_body

routes = APIRouter()

MAX_TOKENIZE_CHARS = 4 << 20  # the body limit bounds it anyway


class TokenizeRequest(RefusingModel):
    """Either prompt (a completion's) or messages (a chat's)."""

    REFUSED = {"mm_processor_kwargs": (NONE, "this server serves text models only")}

    model: str | None = None
    prompt: str | None = Field(None, max_length=MAX_TOKENIZE_CHARS)
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template: str | None = Field(None, max_length=1 << 16)
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None  # taken for the template's sake only, as vLLM does

    def tool_mode(self) -> str | None:
        if not self.tools or self.tool_choice == "none":
            return None
        if isinstance(self.tool_choice, dict):
            return NamedToolChoice.model_validate(self.tool_choice).function.name
        return "auto"


class DetokenizeRequest(RefusingModel):
    model: str | None = None
    tokens: list[TokenId]


@routes.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    body = await parse_body(request, TokenizeRequest)
    ctx: ServerContext = request.app.state.ctx
    ctx.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", param="prompt")
    if body.messages is not None:
        if not body.messages:
            raise APIError(400, "messages must not be empty", param="messages")
        text = await render_text(ctx, body)  # type: ignore[arg-type]
        special = bool(body.add_special_tokens)
    else:
        text = body.prompt or ""
        special = body.add_special_tokens is not False
    tokens = await ctx.encode(text, add_special_tokens=special)
    out: dict[str, Any] = {
        "count": len(tokens),
        "max_model_len": ctx.config.model.max_seq_len,
        "tokens": tokens,
        "token_strs": None,
    }
    if body.return_token_strs:
        out["token_strs"] = [ctx.token_bytes(t, False).decode("utf-8", "replace") for t in tokens]
    return JSONResponse(out)


@routes.post("/detokenize")
async def detokenize(request: Request) -> JSONResponse:
    body = await parse_body(request, DetokenizeRequest)
    ctx: ServerContext = request.app.state.ctx
    ctx.check_model(body.model)
    vocab = ctx.tokenizer.vocab_size
    if any(t >= vocab for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
    return JSONResponse({"prompt": ctx.tokenizer.decode(body.tokens, skip_special_tokens=False)})
