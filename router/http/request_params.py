"""The core's RequestParams of an API request: what the body says, plus what needs the
tokenizer (bad words as token sequences) or the prompt (the default max_tokens)."""

from __future__ import annotations

from dataclasses import replace

from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.schemas import SamplingRequest
from router.requests import RequestParams


def core_params(
    ctx: ServerContext,
    body: SamplingRequest,
    prompt_tokens: int,
    max_tokens: int | None,
    logprobs: bool,
    top_logprobs: int = 0,
    grammar: str = "",
    prompt_logprobs: int | None = None,
) -> RequestParams:
    """max_tokens None: all the room the context leaves (chat's default; the core refuses a
    given max_tokens beyond it)."""
    if max_tokens is None:
        max_tokens = max(1, ctx.config.model.max_seq_len - prompt_tokens)
    params = body.to_params(max_tokens, logprobs, top_logprobs)
    if body.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens must be at most max_tokens ({max_tokens})",
                       param="min_tokens")  # fmt: skip
    words = bad_word_sequences(ctx, body.bad_words or [])
    if prompt_logprobs is None:
        prompt_logprobs = body.prompt_logprobs
    return replace(params, bad_words=words, grammar=grammar, prompt_logprobs=prompt_logprobs)


def bad_word_sequences(ctx: ServerContext, words: list[str]) -> tuple[tuple[int, ...], ...]:
    """Each word as the tokens it is written with, alone and after a space (vLLM's rule: the
    model writes a word mid-sentence with its leading space)."""
    out: dict[tuple[int, ...], None] = {}
    for word in words:
        for text in (word, " " + word.lstrip()):
            ids = tuple(ctx.tokenizer.encode(text, add_special_tokens=False))
            if ids:
                out[ids] = None
    return tuple(out)
