"""POST /v1/chat/completions bodies: messages (tool calls and tool results included), tools and
the tool choice, and the chat-only fields. Everything else is SamplingRequest's (schemas.py)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from router.http import limits
from router.http.schemas import NONE, RefusingModel, SamplingRequest, StrictModel
from router.params import BOUNDS

MAX_TOOLS = 128
MAX_TOOL_CALLS = 128  # in one assistant message of the history


class ContentPart(StrictModel):
    type: Literal["text"]
    text: str


class FunctionCall(StrictModel):
    name: str = Field(min_length=1, max_length=256)
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(StrictModel):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RefusingModel):
    REFUSED = {
        "audio": (NONE, "audio is not supported by this server"),
        "function_call": (NONE, "deprecated by OpenAI: use tool_calls"),
    }

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, max_length=MAX_TOOL_CALLS)
    tool_call_id: str | None = Field(None, max_length=256)
    refusal: str | None = None  # an assistant's earlier refusal: rendered as its content
    reasoning_content: str | None = None  # vLLM's: kept for templates that render it

    @field_validator("content", mode="wrap")
    @classmethod
    def _content(cls, v: Any, handler) -> Any:
        try:
            return handler(v)
        except ValidationError:
            raise ValueError(
                "must be a string or a list of text parts ({'type': 'text', 'text': ...}):"
                " this server serves text models only"
            ) from None

    @field_validator("tool_calls")
    @classmethod
    def _assistant_calls(cls, v: list[ToolCall] | None, info: ValidationInfo):
        if v is not None and info.data.get("role") != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        for call in v or ():
            try:
                json.loads(call.function.arguments)
            except json.JSONDecodeError:
                raise ValueError(f"{call.id}: arguments must be JSON text") from None
        return v

    @field_validator("tool_call_id")
    @classmethod
    def _tool_result(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("role") != "tool":
            raise ValueError("only tool messages carry tool_call_id")
        return v

    def text(self) -> str:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return content or self.refusal or ""


class FunctionDefinition(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None  # the arguments are always constrained when a call is required


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    REFUSED = {
        **SamplingRequest.REFUSED,
        "audio": (NONE, "audio output is not supported by this server"),
        "modalities": ((None, ["text"]), "this server writes text only"),
        "prediction": (NONE, "predicted outputs are not supported by this server"),
        "reasoning_effort": (NONE, "this server serves no reasoning models"),
        "verbosity": (NONE, "not supported by this server"),
        "web_search_options": (NONE, "web search is not supported by this server"),
        "moderation": (NONE, "moderation is not supported by this server"),
        "function_call": (NONE, "deprecated by OpenAI: use tool_choice"),
        "functions": (NONE, "deprecated by OpenAI: use tools"),
        "documents": (NONE, "documents (RAG) are not supported by this server"),
        "echo": ((None, False), "echo is for completions; this server does not echo chats"),
        "media_io_kwargs": (NONE, "this server serves text models only"),
    }

    messages: list[ChatMessage] = Field(min_length=1, max_length=limits.MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())
    max_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())  # the older name
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, **BOUNDS["top_logprobs"].pydantic())
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # the template writes the special tokens
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # default true, as OpenAI's
    chat_template: str | None = Field(None, max_length=1 << 16)  # vLLM's: this request's own
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables for the template

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return v

    @field_validator("max_tokens")
    @classmethod
    def _one_max(cls, v: int | None, info: ValidationInfo) -> int | None:
        given = info.data.get("max_completion_tokens")
        if v is not None and given is not None and given != v:
            raise ValueError("differs from max_completion_tokens: give one of them")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, v: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools") or []
        if v in ("required",) and not tools:
            raise ValueError("'required' needs tools")
        if isinstance(v, NamedToolChoice) and v.function.name not in {
            t.function.name for t in tools
        }:
            raise ValueError(f"names the function {v.function.name!r}, which tools do not define")
        return v

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, v: list[Tool] | None) -> list[Tool] | None:
        names = [t.function.name for t in v or ()]
        if len(set(names)) != len(names):
            raise ValueError("function names must be unique")
        return v

    @field_validator("continue_final_message")
    @classmethod
    def _continue(cls, v: bool, info: ValidationInfo) -> bool:
        messages = info.data.get("messages") or []
        if v and (info.data.get("add_generation_prompt", True) is not False):
            raise ValueError("needs add_generation_prompt: false")
        if v and (not messages or messages[-1].role != "assistant"):
            raise ValueError("needs an assistant message last")
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
        clash = reserved & set(v or {})
        if clash:
            raise ValueError(f"{sorted(clash)} are set by the request itself")
        return v

    def output_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_mode(self) -> str | None:
        """None (no tools in play), "auto", "required", or the required function's name."""
        if not self.tools or self.tool_choice == "none":
            return None
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return self.tool_choice or "auto"

    def parallel(self) -> bool:
        return self.parallel_tool_calls is not False
