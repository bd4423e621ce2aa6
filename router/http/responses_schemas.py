"""POST /v1/responses bodies (OpenAI's Responses API), and their translation into the chat
request the same generation path serves: instructions as the system message, input items as
messages (function calls as an assistant's tool_calls, their outputs as tool messages), flat
function tools as chat tools, text.format as response_format."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from router.http.chat_schemas import ChatCompletionRequest
from router.http.errors import APIError, validation_error
from router.http.schemas import NONE, OPENAI_REFUSED, RefusingModel, StreamOptions, StrictModel
from router.params import BOUNDS

STATELESS = "this server keeps no state between responses"
# the chat request's field names, as the Responses API calls them
CHAT_TO_RESPONSES = {"messages": "input", "max_completion_tokens": "max_output_tokens",
                     "max_tokens": "max_output_tokens", "response_format": "text"}  # fmt: skip


def in_responses_terms(error: APIError) -> APIError:
    """An error about the chat request that serves a Responses request, naming its field."""
    param = CHAT_TO_RESPONSES.get(error.param or "", error.param)
    message = error.message
    if error.param in CHAT_TO_RESPONSES and message.startswith(f"{error.param}"):
        message = param + message[len(error.param) :]
    return APIError(error.status, message, error.kind, param, error.code)


class InputText(StrictModel):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # of an earlier output_text: not rendered
    logprobs: list[Any] | None = None


class MessageItem(StrictModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None  # an earlier output's ids and status: not rendered
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(StrictModel):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(StrictModel):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str
    id: str | None = None
    status: str | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(StrictModel):
    type: Literal["function"]
    name: str


class TextConfig(StrictModel):
    format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}
    verbosity: Literal["medium"] | None = None


class ResponsesRequest(RefusingModel):
    """POST /v1/responses."""

    REFUSED = {
        **OPENAI_REFUSED,
        "previous_response_id": (NONE, STATELESS),
        "conversation": (NONE, STATELESS),
        "background": ((None, False), "background responses are not supported by this server"),
        "background_options": (NONE, "background responses are not supported by this server"),
        "prompt": (NONE, "stored prompts are not supported by this server"),
        "reasoning": (NONE, "this server serves no reasoning models"),
        "max_tool_calls": (NONE, "not supported: use parallel_tool_calls"),
        "truncation": ((None, "disabled"), "prompts are never truncated by this server"),
        "context_management": (NONE, STATELESS),
        "moderation": (NONE, "moderation is not supported by this server"),
        "image": (NONE, "this server serves text models only"),
        "access_programs": (NONE, "not supported by this server"),
    }

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())
    temperature: float | None = Field(None, **BOUNDS["temperature"].pydantic())
    top_p: float | None = Field(None, **BOUNDS["top_p"].pydantic())
    top_logprobs: int | None = Field(None, **BOUNDS["top_logprobs"].pydantic())
    include: list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    user: str | None = Field(None, max_length=256)
    safety_identifier: str | None = Field(None, max_length=256)

    @field_validator("include")
    @classmethod
    def _include(cls, v: list[str] | None) -> list[str] | None:
        if v and set(v) != {"message.output_text.logprobs"}:
            raise ValueError("only message.output_text.logprobs can be included")
        return v

    def logprobs_wanted(self) -> bool:
        return bool(self.include) or bool(self.top_logprobs)

    def as_chat(self) -> ChatCompletionRequest:
        """The chat request that serves this one (400 naming a Responses field when the
        translation is refused)."""
        chat: dict[str, Any] = {
            "messages": self._messages(),
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": self.logprobs_wanted(),
            "top_logprobs": self.top_logprobs if self.logprobs_wanted() else None,
            "parallel_tool_calls": self.parallel_tool_calls,
            "user": self.user,
        }
        if self.tools:
            chat["tools"] = [
                {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                for t in self.tools
            ]
        if isinstance(self.tool_choice, NamedFunctionChoice):
            chat["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            chat["tool_choice"] = self.tool_choice
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.get("type") == "json_schema":
            chat["response_format"] = {"type": "json_schema", "json_schema": {
                k: v for k, v in fmt.items() if k in ("name", "schema", "strict", "description")
            }}  # fmt: skip
        elif fmt is not None:
            chat["response_format"] = fmt
        try:
            return ChatCompletionRequest.model_validate(
                {k: v for k, v in chat.items() if v is not None}
            )
        except ValidationError as exc:
            error = validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])
            raise in_responses_terms(error) from None

    def _messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        items = [MessageItem(role="user", content=self.input)] if isinstance(
            self.input, str
        ) else self.input
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            else:
                messages.append({"role": "tool", "tool_call_id": item.call_id,
                                 "content": item.output})  # fmt: skip
        if not messages:
            raise APIError(400, "input must not be empty", param="input")
        return messages
