"""POST /v1/completions: one or several prompts (text or token ids), n choices each, streamed or
not, with logprobs (and top alternatives) of the sampled tokens; echo puts the prompt (and,
with logprobs, its own logprobs) before the completion, as evaluation harnesses score prompts."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.http import limits
from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.generation import Choice, Generation
from router.http.logprobs import completion_logprobs, prompt_logprobs
from router.http.request_params import core_params
from router.http.schemas import CompletionRequest, parse_body
from router.http.streaming import respond
from router.http.structured import output_grammar
from router.requests import Delta

routes = APIRouter()


@routes.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    body = await parse_body(request, CompletionRequest)
    ctx: ServerContext = request.app.state.ctx
    ctx.check_model(body.model)
    prompts = body.prompts()
    if len(prompts) * body.n > limits.MAX_CHOICES:
        raise APIError(400, f"prompts x n must be at most {limits.MAX_CHOICES}", param="n")
    token_prompts = [
        p if isinstance(p, list) else await ctx.encode(p, body.add_special_tokens) for p in prompts
    ]
    grammar = await output_grammar(ctx, body)
    scored = body.logprobs is not None
    # echo with logprobs scores the prompt too: its logprobs come from the prefill
    prompt_k = body.logprobs if body.echo and scored else None
    if body.prompt_logprobs is not None:
        prompt_k = max(prompt_k or 0, body.prompt_logprobs)
    gen = Generation(ctx, request)
    params = [
        core_params(ctx, body, len(p), body.output_tokens(), scored, body.logprobs or 0,
                    grammar, prompt_k)  # fmt: skip
        for p in token_prompts
    ]
    await gen.start(token_prompts, body.n, params[0] if len(set(params)) == 1 else params)
    texts = [p if isinstance(p, str) else ctx.tokenizer.decode(p) for p in prompts]
    fmt = CompletionFormat(ctx, gen, body, token_prompts, texts)
    return await respond(gen, fmt, body.stream, body.stream_options)


class CompletionFormat:
    def __init__(
        self,
        ctx: ServerContext,
        gen: Generation,
        body: CompletionRequest,
        prompts: list[list[int]],
        texts: list[str],
    ):
        self.ctx = ctx
        self.gen = gen
        self.body = body
        self.prompts = prompts
        self.texts = texts
        self.id = f"cmpl-{gen.request_id}"
        self.created = int(time.time())
        self.offsets = [0] * len(gen.choices)  # where each choice's next token starts, in chars
        self.echoed = [False] * len(gen.choices)

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
        }

    def _logprobs(self, choice: Choice, token_ids, logprobs, top_ids=None, top_logprobs=None):
        if self.body.logprobs is None:
            return None
        out = completion_logprobs(
            self.ctx, token_ids, logprobs, self.body.skip_special_tokens, self.body.logprobs,
            self.offsets[choice.index], top_ids, top_logprobs,
        )  # fmt: skip
        if out["tokens"]:
            self.offsets[choice.index] = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

    def _echo(self, choice: Choice) -> tuple[str, dict[str, Any] | None]:
        """The prompt's text and logprobs, once per choice (echo), before its first tokens."""
        if not self.body.echo or self.echoed[choice.index]:
            return "", None
        self.echoed[choice.index] = True
        prompt = self.prompts[choice.prompt_index]
        logprobs = None
        if self.body.logprobs is not None:
            scores = choice.prompt_scores
            values: list[float | None] = [None, *(scores.logprobs if scores else [])]
            tops = scores.top_ids if scores else []
            top_lps = scores.top_logprobs if scores else []
            logprobs = self._logprobs(choice, prompt, values, [[], *tops] if tops else None,
                                      [[], *top_lps] if tops else None)  # fmt: skip
        return self.texts[choice.prompt_index], logprobs

    @staticmethod
    def _joined(first: dict[str, Any] | None, second: dict[str, Any] | None):
        if first is None or second is None:
            return first or second
        return {key: first[key] + second[key] if first[key] is not None else None
                for key in first}  # fmt: skip

    # ---- streamed ----
    def text_only(self) -> bool:
        return self.body.logprobs is None and not self.body.echo

    def opening_chunks(self) -> list[dict[str, Any]]:
        return []

    def delta_chunk(self, choice: Choice, delta: Delta) -> dict[str, Any] | None:
        echo_text, echo_logprobs = self._echo(choice)
        scored = self.body.logprobs is not None
        if not delta.text and not echo_text and not (scored and delta.token_ids):
            return None
        logprobs = self._logprobs(choice, delta.token_ids, delta.logprobs, delta.top_ids,
                                  delta.top_logprobs)  # fmt: skip
        item = {
            "index": choice.index,
            "text": echo_text + delta.text,
            "logprobs": self._joined(echo_logprobs, logprobs),
            "finish_reason": None,
        }
        return self._chunk([item])

    def finish_chunk(self, choice: Choice) -> dict[str, Any]:
        assert choice.result is not None
        item = {"index": choice.index, "text": "", "logprobs": None,
                "finish_reason": choice.result.finish_reason.api}  # fmt: skip
        return self._chunk([item])

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._chunk([]), "usage": usage}

    # ---- not streamed ----
    def response(self) -> dict[str, Any]:
        items = []
        for c in self.gen.choices:
            assert c.result is not None
            echo_text, echo_logprobs = self._echo(c)
            logprobs = self._logprobs(c, c.token_ids, c.logprobs, c.top_ids, c.top_logprobs)
            item = {
                "index": c.index,
                "text": echo_text + "".join(c.text),
                "logprobs": self._joined(echo_logprobs, logprobs),
                "finish_reason": c.result.finish_reason.api,
            }
            if self.body.prompt_logprobs is not None:
                item["prompt_logprobs"] = prompt_logprobs(
                    self.ctx, self.prompts[c.prompt_index], c.prompt_scores
                )
            items.append(item)
        return {**self._chunk(items), "usage": self.gen.usage()}
