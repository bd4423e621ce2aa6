"""One streaming /v1/completions (or /v1/chat/completions) request, timed per chunk.

A raw asyncio HTTP/1.1 client rather than a general HTTP library: with 128 streams and one chunk
per stream per decode step, a pure-Python HTTP stack would spend a core of its own parsing, and on
a small host the load generator shares the CPUs with the server it measures. It speaks just what
an SSE completion stream needs: chunked or plain bodies and `data: {json}` events ending with
`data: [DONE]`.

Connections are kept alive (HTTP/1.1 keep-alive) through a ConnectionPool, one per benchmark run,
as real OpenAI clients do (the openai SDK over httpx, aiohttp sessions): a fresh TCP connection
plus the server's per-connection setup adds its own time to every measured time to first token,
a cost those clients do not pay. A connection goes back to the pool only once its response
was read to the very end of its body (past `data: [DONE]`, up to the chunked body's last chunk)
and the server did not ask to close it; after any error, timeout or early exit it is closed. A
request on a reused connection that the server had closed while idle (its keep-alive timeout) is
sent again, once, on a fresh connection. Without a pool, each request opens its own connection
and sends `Connection: close`.
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


API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


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


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _open(endpoint: Endpoint) -> Connection:
    ctx = ssl.create_default_context() if endpoint.tls else None
    return await asyncio.open_connection(endpoint.host, endpoint.port, ssl=ctx, limit=1 << 20)


def _usable(conn: Connection) -> bool:
    """False once the server closed its end (EOF seen) or we did."""
    return not conn[0].at_eof() and not conn[1].is_closing()


class ConnectionPool:
    """Idle keep-alive connections to one endpoint, for stream_completion(..., pool=pool).

    Use one pool per benchmark run, inside the event loop that runs it: a closed loop of N
    requests in flight then holds about N connections. `limit` caps how many idle connections
    are kept (extra ones are closed when returned); it never makes a request wait, since the load
    shape already bounds the requests in flight. `opened` counts the connections opened.
    """

    def __init__(self, endpoint: Endpoint, limit: int | None = None):
        self.endpoint = endpoint
        self.limit = limit
        self.opened = 0
        self._idle: list[Connection] = []
        self._closed = False

    async def acquire(self) -> tuple[Connection, bool]:
        """An idle connection (and True: reused) or a new one (and False)."""
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to have timed out
            if _usable(conn):
                return conn, True
            conn[1].close()
        return await self.connect(), False

    async def connect(self) -> Connection:
        """A new connection, not taken from the idle ones."""
        self.opened += 1
        return await _open(self.endpoint)

    def release(self, conn: Connection) -> None:
        """Take back a connection whose response was read whole."""
        full = self.limit is not None and len(self._idle) >= self.limit
        if self._closed or full or not _usable(conn):
            conn[1].close()
        else:
            self._idle.append(conn)

    def close(self) -> None:
        """Close the idle connections; ones in use are closed when returned. Idempotent."""
        self._closed = True
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bool]:
    """Status, headers (lower-case names), and whether the server keeps the connection open."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    version, status = lines[0].split(" ", 2)[:2]
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    connection = headers.get("connection", "").lower()
    persistent = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
    return int(status), headers, persistent


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]):
    """The response body as it arrives (de-chunked). Exhausted only at the body's end."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailer fields (if any) up to the blank line: a kept-alive connection must
                # be left at the start of the next response.
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:  # delimited by EOF: the connection cannot be reused (the pool sees the EOF)
        while data := await reader.read(65536):
            yield data


async def stream_completion(
    endpoint: Endpoint,
    payload: dict[str, Any],
    index: int,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    pool: ConnectionPool | None = None,
    api: str = "completions",
) -> RequestResult:
    """Send one streaming completion (api "completions") or chat completion ("chat"); never
    raises (failures come back as ok=False).

    With a pool, the connection comes from it and goes back to it (keep-alive); without one,
    a connection of its own, closed after the request."""
    result = RequestResult(index=index)
    result.start = time.perf_counter()
    try:
        run = _run(endpoint, payload, api_key, result, pool, API_PATHS[api])
        await asyncio.wait_for(run, timeout_s)
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


def _request(
    endpoint: Endpoint, payload: dict[str, Any], api_key: str | None, keep_alive: bool,
    path: str = API_PATHS["completions"],
) -> bytes:  # fmt: skip
    body = json.dumps(payload, ensure_ascii=False).encode()
    head = (
        f"POST {endpoint.base_path}{path} HTTP/1.1\r\n"
        f"Host: {endpoint.host}:{endpoint.port}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


async def _send(conn: Connection, request: bytes) -> tuple[int, dict[str, str], bool]:
    reader, writer = conn
    writer.write(request)
    await writer.drain()
    return await _read_head(reader)


async def _run(
    endpoint: Endpoint,
    payload: dict[str, Any],
    api_key: str | None,
    result: RequestResult,
    pool: ConnectionPool | None,
    path: str = API_PATHS["completions"],
) -> None:
    request = _request(endpoint, payload, api_key, keep_alive=pool is not None, path=path)
    if pool is None:
        conn = await _open(endpoint)
        try:
            status, headers, _ = await _send(conn, request)
            await _read_response(conn[0], status, headers, result, to_end=False)
        finally:
            conn[1].close()
        return
    conn, reused = await pool.acquire()
    keep = False
    try:
        try:
            status, headers, keep = await _send(conn, request)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            # No byte of an answer on a reused connection: the server closed it while it was
            # idle (its keep-alive timeout) and never saw this request. Send it again, once, on
            # a fresh connection, timed from there: the failed try is not the server's latency.
            if not reused or getattr(exc, "partial", b""):
                raise
            conn[1].close()
            conn = await pool.connect()
            result.start = time.perf_counter()
            status, headers, keep = await _send(conn, request)
        await _read_response(conn[0], status, headers, result, to_end=True)
    except HTTPStatusError:
        raise  # its body was read whole: the connection is as good as after a 200
    except BaseException:  # errors, timeouts (cancellation): the stream's state is unknown
        keep = False
        raise
    finally:
        if keep:
            pool.release(conn)
        else:
            conn[1].close()


async def _read_response(
    reader: asyncio.StreamReader,
    status: int,
    headers: dict[str, str],
    result: RequestResult,
    to_end: bool,
) -> None:
    """Read the answer into result; raise HTTPStatusError (after reading its body) on a status
    other than 200. Without to_end, return at [DONE]; with it, read on to the end of the body so
    the connection can carry the next request (e2e stays the time [DONE] arrived)."""
    result.status = status
    if status != 200:
        raw = b"".join([part async for part in _body(reader, headers)])
        raise HTTPStatusError(status, raw)
    buffer = b""
    async for data in _body(reader, headers):
        if result.e2e is not None:
            continue  # past [DONE]: only the end of the body is left
        now = time.perf_counter() - result.start
        buffer += data
        while (cut := buffer.find(b"\n\n")) >= 0:
            event, buffer = buffer[:cut], buffer[cut + 2 :]
            if _event(event, now, result):
                result.e2e = now
                if not to_end:
                    return
                break


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
            # a completion chunk's text, or a chat chunk's delta.content
            text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
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
