"""One streaming /v1/completions request, timed per chunk.

A raw asyncio HTTP/1.1 client (one connection per request, `Connection: close`) rather than a
general HTTP library: with 128 streams and one chunk per stream per decode step, a pure-Python
HTTP stack would spend a core of its own parsing, and on a small host the load generator shares
the CPUs with the server it measures. It speaks just what an SSE completion stream needs:
chunked or plain bodies and `data: {json}` events ending with `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestResult:
    """What one request measured. Times are seconds; chunk_times are relative to start."""

    index: int
    ok: bool = False
    start: float = 0.0  # time.perf_counter() when the request was sent
    ttft: float | None = None
    e2e: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk with text
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_reported: bool = False
    finish_reason: str | None = None
    text_chars: int = 0
    status: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname or "127.0.0.1", port, tls, parts.path.rstrip("/"))


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]):
    """The response body as it arrives (de-chunked)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


async def stream_completion(
    endpoint: Endpoint,
    payload: dict[str, Any],
    index: int,
    api_key: str | None = None,
    timeout_s: float = 600.0,
) -> RequestResult:
    """Send one streaming completion; never raises (failures come back as ok=False)."""
    result = RequestResult(index=index)
    result.start = time.perf_counter()
    try:
        await asyncio.wait_for(_run(endpoint, payload, api_key, result), timeout_s)
    except TimeoutError:
        result.error = f"timed out after {timeout_s:g}s"
    except HTTPStatusError as exc:
        result.status, result.error = exc.status, str(exc)
    except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.LimitOverrunError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    if result.error is None and result.e2e is None:
        result.error = "stream ended without [DONE]"
    result.ok = result.error is None
    if not result.usage_reported:  # a server without usage: one token per text chunk at best
        result.completion_tokens = len(result.chunk_times)
    return result


async def _run(
    endpoint: Endpoint, payload: dict[str, Any], api_key: str | None, result: RequestResult
) -> None:
    body = json.dumps(payload, ensure_ascii=False).encode()
    head = (
        f"POST {endpoint.base_path}/v1/completions HTTP/1.1\r\n"
        f"Host: {endpoint.host}:{endpoint.port}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    ctx = ssl.create_default_context() if endpoint.tls else None
    reader, writer = await asyncio.open_connection(
        endpoint.host, endpoint.port, ssl=ctx, limit=1 << 20
    )
    try:
        writer.write(head.encode("latin-1") + b"\r\n" + body)
        await writer.drain()
        status, headers = await _read_head(reader)
        result.status = status
        if status != 200:
            raw = b"".join([part async for part in _body(reader, headers)])
            raise HTTPStatusError(status, raw)
        buffer = b""
        async for data in _body(reader, headers):
            now = time.perf_counter() - result.start
            buffer += data
            while (cut := buffer.find(b"\n\n")) >= 0:
                event, buffer = buffer[:cut], buffer[cut + 2 :]
                if _event(event, now, result):
                    result.e2e = now
                    return
    finally:
        writer.close()


def _event(event: bytes, now: float, result: RequestResult) -> bool:
    """Apply one SSE event to result; True at [DONE]."""
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return True
        chunk = json.loads(data)
        if chunk.get("error"):
            err = chunk["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise ValueError(f"stream error: {message}")
        for choice in chunk.get("choices") or ():
            text = choice.get("text") or ""
            if text:
                if result.ttft is None:
                    result.ttft = now
                result.chunk_times.append(now)
                result.text_chars += len(text)
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
                if result.ttft is None:
                    result.ttft = now
        usage = chunk.get("usage")
        if usage:
            result.usage_reported = True
            result.prompt_tokens = int(usage.get("prompt_tokens", 0))
            result.completion_tokens = int(usage.get("completion_tokens", 0))
    return False
