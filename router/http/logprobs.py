"""Logprobs of the sampled tokens in OpenAI's two shapes. Only the chosen token's logprob exists
(the engines do not return alternatives), so top_logprobs holds just the chosen token."""

from __future__ import annotations

from typing import Any

from router.http.context import ServerContext


def completion_logprobs(
    ctx: ServerContext,
    token_ids: list[int],
    logprobs: list[float],
    skip_special_tokens: bool,
    top: int,
    text_offset: int,
) -> dict[str, Any]:
    """/v1/completions: {"tokens", "token_logprobs", "text_offset", "top_logprobs"}; text_offset
    is where the tokens start in the choice's text."""
    tokens, offsets = [], []
    for t in token_ids:
        text = ctx.token_bytes(t, skip_special_tokens).decode("utf-8", "replace")
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": list(logprobs),
        "text_offset": offsets,
        "top_logprobs": [{s: lp} for s, lp in zip(tokens, logprobs, strict=True)] if top else None,
    }


def chat_logprobs(
    ctx: ServerContext,
    token_ids: list[int],
    logprobs: list[float],
    skip_special_tokens: bool,
    top: int,
) -> dict[str, Any]:
    """/v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}."""
    content = []
    for t, lp in zip(token_ids, logprobs, strict=True):
        raw = ctx.token_bytes(t, skip_special_tokens)
        entry = {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}
        entry["top_logprobs"] = [dict(entry)] if top else []
        content.append(entry)
    return {"content": content}
