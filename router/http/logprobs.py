"""Logprobs in OpenAI's two shapes, and vLLM's prompt_logprobs.

The values are the engine's (splitserve/engine/interface.py): the sampled token's logprob and
its top-k alternatives are log_softmax of the logits the token was drawn from, after the
grammar mask, penalties, logit bias and temperature (vLLM's processed logprobs); a prompt's
logprobs are those of its raw logits.
"""

from __future__ import annotations

from typing import Any

from router.http.context import ServerContext
from splitserve.protocol import PromptScores

# JSON has no -inf: a token filtered out of the distribution (top-k, top-p, min-p, a grammar)
# has this logprob instead, as vLLM writes it
FLOOR = -9999.0


def _finite(logprob: float | None) -> float | None:
    return logprob if logprob is None or logprob > FLOOR else FLOOR


def _text(ctx: ServerContext, token: int, skip_special_tokens: bool) -> str:
    return ctx.token_bytes(token, skip_special_tokens).decode("utf-8", "replace")


def completion_logprobs(
    ctx: ServerContext,
    token_ids: list[int],
    logprobs: list[float | None],
    skip_special_tokens: bool,
    top: int,
    text_offset: int,
    top_ids: list[list[int]] | None = None,
    top_logprobs: list[list[float]] | None = None,
) -> dict[str, Any]:
    """/v1/completions: {"tokens", "token_logprobs", "text_offset", "top_logprobs"}; text_offset
    is where the tokens start in the choice's text. A token without a logprob (an echoed
    prompt's first) has None for it and for its alternatives."""
    tokens, offsets, tops = [], [], []
    for i, (t, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        text = _text(ctx, t, skip_special_tokens)
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
        if top:
            if lp is None:
                tops.append(None)
                continue
            alternatives = {text: _finite(lp)}
            ids = top_ids[i] if top_ids else []
            for a, alp in zip(ids[:top], (top_logprobs[i] if top_logprobs else [])[:top],
                              strict=True):  # fmt: skip
                alternatives.setdefault(_text(ctx, a, False), _finite(alp))  # "" tells nothing
            tops.append(alternatives)
    return {
        "tokens": tokens,
        "token_logprobs": [_finite(lp) for lp in logprobs],
        "text_offset": offsets,
        "top_logprobs": tops if top else None,
    }


def chat_logprobs(
    ctx: ServerContext,
    token_ids: list[int],
    logprobs: list[float],
    skip_special_tokens: bool,
    top: int,
    top_ids: list[list[int]] | None = None,
    top_logprobs: list[list[float]] | None = None,
) -> dict[str, Any]:
    """/v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}."""
    content = []
    for i, (t, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        entry = _entry(ctx, t, lp, skip_special_tokens)
        ids = top_ids[i] if top_ids else []
        lps = top_logprobs[i] if top_logprobs else []
        entry["top_logprobs"] = [  # a special token's own text: an empty one tells nothing
            _entry(ctx, a, alp, False) for a, alp in zip(ids[:top], lps[:top], strict=True)
        ]
        content.append(entry)
    return {"content": content}


def _entry(ctx: ServerContext, token: int, logprob: float, skip: bool) -> dict[str, Any]:
    raw = ctx.token_bytes(token, skip)
    return {"token": raw.decode("utf-8", "replace"), "logprob": _finite(logprob),
            "bytes": list(raw)}  # fmt: skip


def prompt_logprobs(
    ctx: ServerContext, prompt: list[int], scores: PromptScores | None
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's prompt_logprobs: None for the first token, then per token {id: {"logprob",
    "rank", "decoded_token"}} of the prompt's token and its alternatives."""
    if scores is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for i, token in enumerate(prompt[1:]):
        entry = {str(token): {"logprob": _finite(scores.logprobs[i]), "rank": scores.ranks[i],
                              "decoded_token": _text(ctx, token, False)}}  # fmt: skip
        ids = scores.top_ids[i] if scores.top_ids else []
        for rank, (a, alp) in enumerate(zip(ids, scores.top_logprobs[i], strict=True), 1):
            entry.setdefault(str(a), {"logprob": _finite(alp), "rank": rank,
                                      "decoded_token": _text(ctx, a, False)})  # fmt: skip
        out.append(entry)
    return out
