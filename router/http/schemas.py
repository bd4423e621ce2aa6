"""Request bodies, as pydantic models: the types, ranges and bounds every request is checked
against before anything else looks at it.

Validation is strict (no "16" for 16, no 1 for true) and rejects NaN and infinities; unknown
fields are ignored, as OpenAI's clients send fields this server has no use for. Parameters this
server cannot honour are accepted only at their neutral value, so that nothing is silently
ignored. Defaults follow OpenAI's API.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from starlette.requests import ClientDisconnect

from router import params
from router.http import limits
from router.http.errors import APIError, ClientGone, validation_error
from router.http.unicode import find_lone_surrogate, may_hold_surrogates
from router.params import BOUNDS
from router.requests import RequestParams

M = TypeVar("M", bound=BaseModel)
TokenId = Annotated[int, Field(ge=0)]
TokenIds = list[TokenId]


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body as a model, whatever the Content-Type says (curl -d sends a form type).
    Refuses (400) what is not valid JSON, not valid Unicode (see unicode.py) or not the model;
    a client that leaves while its body is uploading is ClientGone (499), not a server error."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise ClientGone() from None
    try:
        # decoded here, strictly: json.loads(bytes) would let UTF-8-encoded surrogates through
        text = raw.decode(json.detect_encoding(raw))
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        message = f"malformed JSON body: {exc.msg} at position {exc.pos}"
        raise APIError(400, message, code="invalid_json") from None
    except ValueError as exc:  # not UTF-8, or an integer of thousands of digits
        raise APIError(400, f"malformed JSON body: {exc}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "malformed JSON body: nested too deeply", code="invalid_json") from None
    if may_hold_surrogates(text):
        path = find_lone_surrogate(data)
        if path is not None:
            where = ".".join(path) if path else "request body"
            message = f"{where}: a lone UTF-16 surrogate escape is not valid Unicode text"
            raise APIError(400, message, param=path[0] if path else None, code="invalid_unicode")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class StreamOptions(StrictModel):
    include_usage: bool = False  # a last chunk with usage and no choices
    continuous_usage_stats: bool = False  # usage in every chunk


class SamplingRequest(StrictModel):
    """What completions, chat and /generate have in common."""

    model: str | None = None
    n: int = Field(1, ge=1, le=limits.MAX_N)
    temperature: float | None = Field(None, **BOUNDS["temperature"].pydantic())
    top_p: float | None = Field(None, **BOUNDS["top_p"].pydantic())
    # vLLM's -1 means off, as 0 does
    top_k: int | None = Field(None, ge=-1, le=BOUNDS["top_k"].hi)
    min_tokens: int = Field(0, **BOUNDS["min_tokens"].pydantic())
    seed: int | None = Field(None, **BOUNDS["seed"].pydantic())
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=params.MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > params.MAX_STOP:
            raise ValueError(f"at most {params.MAX_STOP} stop strings")
        if any(not s or len(s) > params.MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop strings must have 1-{params.MAX_STOP_CHARS} characters")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo):
        if v is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float | None) -> float | None:
        if v:
            raise ValueError("is not supported by this server (only 0)")
        return v

    @field_validator("repetition_penalty")
    @classmethod
    def _no_repetition_penalty(cls, v: float | None) -> float | None:
        if v is not None and v != 1.0:
            raise ValueError("is not supported by this server (only 1)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, v: dict | None) -> dict | None:
        if v:
            raise ValueError("is not supported by this server")
        return v

    def to_params(self, max_tokens: int, logprobs: bool) -> RequestParams:
        return RequestParams(
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(0, self.top_k or 0),
            seed=self.seed,
            stop=tuple(self.stop or ()),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs=logprobs,
        )


PROMPT_SHAPES = "a string, a list of strings, a list of token ids or a list of lists of token ids"


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[TokenId] | list[TokenIds]
    max_tokens: int | None = Field(16, **BOUNDS["max_tokens"].pydantic())
    logprobs: int | None = Field(None, ge=0, le=params.MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt(cls, v: Any, handler) -> Any:
        try:
            prompt = handler(v)
        except ValidationError:  # one clear message instead of one per member of the union
            raise ValueError(f"must be {PROMPT_SHAPES}") from None
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("must not be empty")
            if len(prompt) > limits.MAX_PROMPTS and not isinstance(prompt[0], int):
                raise ValueError(f"at most {limits.MAX_PROMPTS} prompts per request")
        return prompt

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("is not supported by this server")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("is not supported by this server")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and v != info.data.get("n", 1):
            raise ValueError("must equal n (this server returns every sample)")
        return v

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt as a list of prompts: texts, or token id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return p  # type: ignore[return-value]


class ContentPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    @field_validator("content", mode="wrap")
    @classmethod
    def _content(cls, v: Any, handler) -> Any:
        try:
            return handler(v)
        except ValidationError:
            raise ValueError(
                "must be a string or a list of text parts ({'type': 'text', 'text': ...})"
            ) from None

    def for_template(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        out = {"role": self.role, "content": content or ""}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=limits.MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())
    max_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())  # the older name
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=params.MAX_LOGPROBS)
    add_generation_prompt: bool = True
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return v

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: list | None) -> list | None:
        if v:
            raise ValueError("tool calling is not supported by this server")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, v: Any) -> Any:
        if v not in (None, "none", "auto"):
            raise ValueError("tool calling is not supported by this server")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: dict | None) -> dict | None:
        if v is not None and v.get("type") != "text":
            raise ValueError("only {'type': 'text'} is supported by this server")
        return v


class GenerateRequestBody(SamplingRequest):
    """POST /generate: the native endpoint, one prompt as text or token ids."""

    n: int = Field(1, ge=1, le=1)
    prompt: str | None = None
    prompt_token_ids: list[TokenId] | None = Field(None, validate_default=True)
    add_special_tokens: bool = True
    max_tokens: int = Field(16, **BOUNDS["max_tokens"].pydantic())
    logprobs: bool = False

    @field_validator("prompt_token_ids")
    @classmethod
    def _one_prompt(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if (v is None) == (info.data.get("prompt") is None):
            raise ValueError("give exactly one of prompt and prompt_token_ids")
        return v
