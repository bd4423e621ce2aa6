"""Request bodies, as pydantic models: the types, ranges and bounds every request is checked
against before anything else looks at it.

Validation is strict (no "16" for 16, no 1 for true) and rejects NaN and infinities. Nothing is
silently ignored: every field of OpenAI's request schemas and of vLLM's extras is either honoured
or refused with a 400 naming it (REFUSED: such fields are taken only at their neutral values),
and a field this server does not know at all is refused too (tests/test_api_fields.py
enumerates the openai package's own request types to prove it). Defaults follow OpenAI's API.
Chat bodies are in chat_schemas.py, Responses API bodies in responses_schemas.py.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, TypeVar

from fastapi import Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.requests import ClientDisconnect

from router.http import limits
from router.http.errors import APIError, ClientGone, validation_error
from router.http.unicode import find_lone_surrogate, may_hold_surrogates
from router.params import BOUNDS
from router.requests import RequestParams
from splitserve.protocol.params import LIMITS

M = TypeVar("M", bound=BaseModel)
TokenId = Annotated[int, Field(ge=0)]
TokenIds = list[TokenId]
BIAS = LIMITS["logit_bias"].item.client  # of each entry of a logit_bias


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
        refused = _refused_field(exc)
        if refused is not None:
            raise APIError(
                400, str(refused), param=refused.name, code="unsupported_field"
            ) from None
        raise validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def _refused_field(exc: ValidationError) -> RefusedField | None:
    for error in exc.errors():
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, RefusedField):
            return cause
    return None


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


class RefusingModel(StrictModel):
    """A model some of whose fields this server cannot honour: REFUSED maps each to the values
    it takes (their neutral ones, which change nothing: they are dropped here); any other
    value is a 400 naming the field and saying why."""

    REFUSED: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        if isinstance(data, dict) and not cls.REFUSED.keys().isdisjoint(data):
            for name, (neutral, why) in cls.REFUSED.items():
                if name in data and data[name] not in neutral:
                    raise RefusedField(name, why)
            data = {k: v for k, v in data.items() if k not in cls.REFUSED}
        return data


class RefusedField(ValueError):
    """A field this server cannot honour, at a value that is not its neutral one."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")
        self.name = name


NONE = (None,)
NOT_STORED = "this server stores nothing"
# vLLM's sampling extras that this server does not implement (completions and chat alike)
VLLM_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_beam_search": ((None, False), "beam search is not supported by this server"),
    "length_penalty": ((None, 1.0, 1), "applies to beam search, which this server does not do"),
    "truncate_prompt_tokens": (NONE, "prompt truncation is not supported: shorten the prompt"),
    "allowed_token_ids": (NONE, "not supported: use structured_outputs or logit_bias"),
    "spaces_between_special_tokens": ((None, True), "only true is supported"),
    "logits_processors": (NONE, "custom logits processors are not supported"),
    "priority": ((None, 0), "request priorities are not supported by this server"),
    "cache_salt": (NONE, "prefix caching is not supported by this server"),
    "kv_transfer_params": (NONE, "KV transfer parameters are not supported by this server"),
    "vllm_xargs": (NONE, "not supported by this server"),
    "return_tokens_as_token_ids": ((None, False), "not supported by this server"),
    "return_token_ids": ((None, False), "not supported: use /generate for token ids"),
    "request_id": (NONE, "send the X-Request-Id header instead"),
    "guided_decoding_backend": ((None, "auto", "guidance", "llguidance"),
                                "this server's grammar engine is llguidance"),
    "guided_whitespace_pattern": (NONE, "not supported: JSON is written without extra space"),
    "mm_processor_kwargs": (NONE, "this server serves text models only"),
    "prompt_embeds": (NONE, "prompt embeddings are not supported by this server"),
}
# OpenAI's fields that this server does not implement
OPENAI_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "store": ((None, False), NOT_STORED),
    "metadata": ((None, {}), f"metadata is for stored completions; {NOT_STORED}"),
    "service_tier": ((None, "auto", "default"), "this server has one service tier"),
    "prompt_cache_key": (NONE, "prompt caching is not supported by this server"),
    "prompt_cache_options": (NONE, "prompt caching is not supported by this server"),
    "prompt_cache_retention": (NONE, "prompt caching is not supported by this server"),
}


class StreamOptions(StrictModel):
    include_usage: bool = False  # a last chunk with usage and no choices
    continuous_usage_stats: bool = False  # usage in every chunk
    include_obfuscation: bool = False  # OpenAI's padding of streamed events: never added here

    @field_validator("include_obfuscation")
    @classmethod
    def _no_obfuscation(cls, v: bool) -> bool:
        if v:
            raise ValueError("this server does not pad streamed events")
        return v


class SamplingRequest(RefusingModel):
    """What completions, chat and /generate have in common."""

    REFUSED = {**VLLM_REFUSED, **OPENAI_REFUSED}

    model: str | None = None
    n: int = Field(1, ge=1, le=limits.MAX_N)
    temperature: float | None = Field(None, **BOUNDS["temperature"].pydantic())
    top_p: float | None = Field(None, **BOUNDS["top_p"].pydantic())
    # vLLM's -1 means off, as 0 does
    top_k: int | None = Field(None, ge=-1, le=BOUNDS["top_k"].hi)
    min_tokens: int = Field(0, **BOUNDS["min_tokens"].pydantic())
    seed: int | None = Field(None, **BOUNDS["seed"].pydantic())
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = Field(
        None, max_length=LIMITS["stop_token_ids"].client.hi
    )
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)  # logged with the request
    safety_identifier: str | None = Field(None, max_length=256)  # logged with the request
    presence_penalty: float | None = Field(None, **BOUNDS["presence_penalty"].pydantic())
    frequency_penalty: float | None = Field(None, **BOUNDS["frequency_penalty"].pydantic())
    repetition_penalty: float | None = Field(None, **BOUNDS["repetition_penalty"].pydantic())
    # token id (as a string, as JSON keys are) -> bias in [-100, 100]
    logit_bias: dict[str, float] | None = Field(
        None, max_length=LIMITS["logit_bias"].client.hi
    )
    min_p: float | None = Field(None, **BOUNDS["min_p"].pydantic())
    bad_words: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        None, max_length=LIMITS["bad_words"].client.hi // 2
    )
    prompt_logprobs: int | None = Field(None, **BOUNDS["prompt_logprobs"].pydantic())
    # structured output (router/http/structured.py turns these into one grammar)
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        count, chars = LIMITS["stop"].client, LIMITS["stop"].item.client
        if len(stops) not in count:
            raise ValueError(f"at most {count.hi} stop strings")
        if any(len(s) not in chars for s in stops):
            raise ValueError(f"stop strings must have {chars.lo}-{chars.hi} characters")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo):
        if v is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isdigit() or len(key) > 10:
                raise ValueError(f"keys are token ids (as strings), not {key[:20]!r}")
            if bias not in BIAS:
                raise ValueError(f"each bias must be {BIAS.describe()}")
        return v

    def to_params(self, max_tokens: int, logprobs: bool, top_logprobs: int = 0) -> RequestParams:
        """The core's parameters (bad_words and the grammar are the endpoint's to add: they
        need the tokenizer and structured.py)."""
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
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=tuple((int(k), float(b)) for k, b in (self.logit_bias or {}).items()),
            min_p=self.min_p or 0.0,
            top_logprobs=top_logprobs,
            prompt_logprobs=self.prompt_logprobs,
        )


PROMPT_SHAPES = "a string, a list of strings, a list of token ids or a list of lists of token ids"


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[TokenId] | list[TokenIds]
    max_tokens: int | None = Field(16, **BOUNDS["max_tokens"].pydantic())
    # not OpenAI's for completions, but clients send it: the same as max_tokens
    max_completion_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())
    logprobs: int | None = Field(None, ge=0, le=BOUNDS["top_logprobs"].hi)
    echo: bool = False  # the prompt before the completion (and its logprobs, with logprobs)
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True

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

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("fill-in-the-middle is not supported by this server")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and v != info.data.get("n", 1):
            raise ValueError("must equal n (this server returns every sample)")
        return v

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_max(cls, v: int | None, info: ValidationInfo) -> int | None:
        given = info.data.get("max_tokens")
        if v is not None and given not in (None, 16, v):
            raise ValueError("differs from max_tokens: give one of them")
        return v

    def output_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 16

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt as a list of prompts: texts, or token id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return p  # type: ignore[return-value]


class GenerateRequestBody(SamplingRequest):
    """POST /generate: the native endpoint, one prompt as text or token ids."""

    REFUSED = {
        **SamplingRequest.REFUSED,
        "prompt_logprobs": (NONE, "not returned by /generate: use /v1/completions"),
    }

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
