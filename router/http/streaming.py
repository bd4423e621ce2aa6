"""Server-sent events: `data: {json}\\n\\n` per chunk, `data: [DONE]` at the end.

One driver serves every streaming endpoint; an endpoint supplies a ChunkFormat that says what its
chunks look like. The driver owns the rules they share: opening chunks, skipping empty deltas,
exactly one finishing chunk per choice, usage (in every chunk or in a last one), and an error
event followed by [DONE] when a request fails after the stream began.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response, StreamingResponse

from router.http.errors import internal_error
from router.http.generation import Choice, Generation
from router.http.schemas import StreamOptions
from router.requests import Delta

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# JSON leaves these unescaped, but many SSE clients (httpx's iter_lines, str.splitlines) break lines
# at them, which would cut an event in two: escape them (they can only occur inside strings).
_LINE_BREAKERS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(payload: dict[str, Any]) -> bytes:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKERS)
    return b"data: " + text.encode() + b"\n\n"


_MARK = "\ue000splitserve-text\ue000"  # stands for the text while a template is made


class TextEvents:
    """A choice's text-only delta events from a template: the chunk is encoded once, with a
    marker where the text goes, and each event only JSON-encodes its text into it. Every token
    of every stream passes here, and encoding the whole chunk each time cost the router more
    than any other step of its own."""

    def __init__(self, render: Callable[[str], bytes | None]):
        self.render = render  # text -> the whole event, the slow way
        whole = render(_MARK)
        parts = whole.split(_MARK.encode()) if whole is not None else []
        self.template = (parts[0], parts[1]) if len(parts) == 2 else None

    def event(self, text: str) -> bytes | None:
        template = self.template
        if template is None:  # the format does not show the text verbatim: the slow way
            return self.render(text)
        encoded = json.dumps(text, ensure_ascii=False)[1:-1].translate(_LINE_BREAKERS)
        return template[0] + encoded.encode() + template[1]


class ChunkFormat(Protocol):
    def opening_chunks(self) -> list[dict[str, Any]]: ...

    def text_only(self) -> bool:
        """Delta chunks carry nothing but their text (no logprobs): TextEvents may serve."""
        ...

    def delta_chunk(self, choice: Choice, delta: Delta) -> dict[str, Any] | None: ...

    def finish_chunk(self, choice: Choice) -> dict[str, Any]: ...

    # optional: def closing_chunks(self, choice) -> list[dict]: chunks before the finishing one

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]: ...

    def response(self) -> dict[str, Any]: ...


def _none(_choice: Choice) -> list[dict[str, Any]]:
    return []


async def respond(
    gen: Generation, fmt: ChunkFormat, stream: bool, options: StreamOptions | None
) -> Response:
    """The endpoint's answer: an SSE stream, or one JSON body once every choice has ended."""
    if stream:
        return sse_response(gen, fmt, options)
    try:
        await gen.run_to_end()
        error = gen.failure()
        if error is not None:
            raise error
        return JSONResponse(fmt.response())
    finally:
        gen.close()


def sse_response(
    gen: Generation, fmt: ChunkFormat, options: StreamOptions | None
) -> StreamingResponse:
    return StreamingResponse(
        stream_events(gen, fmt, options or StreamOptions()),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


async def stream_events(
    gen: Generation, fmt: ChunkFormat, options: StreamOptions
) -> AsyncIterator[bytes]:
    def event(chunk: dict[str, Any]) -> bytes:
        if options.continuous_usage_stats:
            chunk["usage"] = gen.usage()
        elif options.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    def render(choice: Choice, text: str) -> bytes | None:
        chunk = fmt.delta_chunk(choice, Delta(text, [], []))
        return event(chunk) if chunk is not None else None

    # usage in every chunk changes each event: no template then
    templates = None
    if fmt.text_only() and not options.continuous_usage_stats:
        templates = {c.index: TextEvents(partial(render, c)) for c in gen.choices}
    failed = False
    try:
        for chunk in fmt.opening_chunks():
            yield event(chunk)
        async for choice, delta in gen.events():
            if delta is not None:
                if templates is not None:
                    if delta.text:
                        data = templates[choice.index].event(delta.text)
                        if data is not None:
                            yield data
                    continue
                chunk = fmt.delta_chunk(choice, delta)
                if chunk is not None:
                    yield event(chunk)
                continue
            error = gen.failure(choice)
            if error is not None:
                failed = True
                gen.abort()  # one failed choice fails the request: end the others too
                log.info("%s: failed while streaming: %s", gen.request_id, error.logged)
                yield sse(error.body())
                break
            for chunk in getattr(fmt, "closing_chunks", _none)(choice):
                yield event(chunk)
            yield event(fmt.finish_chunk(choice))
        if options.include_usage and not failed:
            yield sse(fmt.usage_chunk(gen.usage()))
    except Exception:  # a bug here must not leave the client hanging: report it in the stream
        log.exception("%s: internal error while streaming", gen.request_id)
        yield sse(internal_error(gen.request_id).body())
    finally:
        gen.close()
    yield DONE
