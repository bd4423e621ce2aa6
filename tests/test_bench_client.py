"""The load generator's HTTP client (splitserve/bench/client.py) against real local servers: a
uvicorn + Starlette app that answers like the real router (chunked SSE), and raw asyncio servers
that misbehave on purpose (close idle connections, drop a request, stall, fail mid-stream).
What is checked: keep-alive reuse through a ConnectionPool, the one retry after a server closed
an idle connection, connections closed after errors, and `Connection: close` without a pool."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from splitserve.bench.client import ConnectionPool, Endpoint, RequestResult, stream_completion

LINGER_S = 0.5  # how long the "linger" answer waits between [DONE] and the end of its body


def _sse(chunk: dict | str) -> bytes:
    data = chunk if isinstance(chunk, str) else json.dumps(chunk, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _text(text: str) -> bytes:
    return _sse({"choices": [{"index": 0, "text": text, "finish_reason": None}]})


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
LAST = _sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": USAGE})
DONE = _sse("[DONE]")
EVENTS = [_text("hi"), _text(" you"), LAST, DONE]  # what the real server streams, in short


def _payload(prompt: str) -> dict:
    return {"prompt": prompt, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip


def _assert_ok(r: RequestResult) -> None:
    assert r.ok and r.error is None and r.status == 200, r.error
    assert r.text_chars == len("hi you") and len(r.chunk_times) == 2
    assert r.ttft == r.chunk_times[0] and 0 < r.ttft <= r.chunk_times[1] <= r.e2e
    assert r.finish_reason == "length"
    assert r.usage_reported and (r.prompt_tokens, r.completion_tokens) == (3, 2)


# -- a uvicorn server, as real as it gets --------------------------------------------------------


async def _completions(request: Request):
    prompt = (await request.json())["prompt"]
    # (client port, Connection header): a port stands for one connection while that is open
    request.app.state.seen.append((request.client.port, request.headers.get("connection")))
    if prompt == "busy":
        error = {"message": "too many requests in flight", "type": "overloaded", "code": 429}
        return JSONResponse({"error": error}, status_code=429)

    async def stream():
        for event in EVENTS:
            yield event
        if prompt == "linger":
            await asyncio.sleep(LINGER_S)  # the body's last chunk comes well after [DONE]

    return StreamingResponse(stream(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def uvicorn_app():
    """(url, seen): a uvicorn server in a thread; seen lists each request's (port, Connection)."""
    app = Starlette(routes=[Route("/v1/completions", _completions, methods=["POST"])])
    app.state.seen = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.seen
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@pytest.fixture
def app(uvicorn_app):
    url, seen = uvicorn_app
    seen.clear()
    return Endpoint.parse(url), seen


async def _sequence(endpoint: Endpoint, prompts: list[str], pool: ConnectionPool | None):
    """Send prompts one after the other; their results and wall times."""
    out = []
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        r = await stream_completion(endpoint, _payload(prompt), i, timeout_s=30, pool=pool)
        out.append((r, time.perf_counter() - t0))
    return out


def _pooled_sequence(endpoint: Endpoint, prompts: list[str]):
    """_sequence through one pool, closed after (twice: harmless); (results, connections)."""

    async def main():
        pool = ConnectionPool(endpoint)
        try:
            return await _sequence(endpoint, prompts, pool), pool.opened
        finally:
            pool.close()
            pool.close()

    return asyncio.run(main())


@pytest.mark.timeout(60)
def test_sequential_requests_share_one_connection(app):
    endpoint, seen = app

    timed, opened = _pooled_sequence(endpoint, ["linger"] + ["hello"] * 9)
    assert opened == 1
    assert len(seen) == 10 and len({port for port, _ in seen}) == 1
    assert {header for _, header in seen} == {"keep-alive"}
    for r, _ in timed:
        _assert_ok(r)
    first, wall = timed[0]
    # The client read on to the body's end before reusing the connection, yet e2e is [DONE]'s.
    assert first.e2e < LINGER_S <= wall


@pytest.mark.timeout(60)
def test_an_error_status_is_reported_and_the_pool_goes_on(app):
    endpoint, seen = app

    timed, opened = _pooled_sequence(endpoint, ["busy", "hello", "busy", "hello"])
    results = [r for r, _ in timed]
    for busy in results[0::2]:
        assert not busy.ok and busy.status == 429
        assert busy.error.startswith("HTTP 429") and "too many requests in flight" in busy.error
        assert busy.ttft is None and busy.e2e is None
    for r in results[1::2]:
        _assert_ok(r)
    # The 429's body was read whole, so its connection carried the next requests.
    assert opened == 1 and len({port for port, _ in seen}) == 1


@pytest.mark.timeout(60)
def test_without_a_pool_each_request_says_connection_close(app):
    endpoint, seen = app
    timed = asyncio.run(_sequence(endpoint, ["hello", "hello"], None))
    for r, _ in timed:
        _assert_ok(r)
    assert [header for _, header in seen] == ["close", "close"]


# -- raw servers that misbehave on purpose -------------------------------------------------------


def _response(close: bool) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    if close:
        head += b"connection: close\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"
    return head + b"\r\n" + body


class RawServer:
    """An HTTP/1.1 server written out by hand, one behaviour per mode:

    close_after       answers without `Connection: close`, then closes anyway (an idle timeout)
    connection_close  answers with `Connection: close`, then closes
    drop_second       on a connection's second request, closes without answering
    drop_all          closes every connection without answering
    stall_first       the first request gets no answer (the client times out)
    error_first       the first request's stream carries an error event, then ends normally
    """

    def __init__(self, mode: str):
        self.mode = mode
        self.connections = 0
        self.requests = 0
        self.drops: list[float] = []  # perf_counter() of each request closed unanswered
        self.closed_by_client = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_client += 1
                    return
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)))
                self.requests += 1
                mode = self.mode
                if mode == "drop_all" or (mode == "drop_second" and served == 1):
                    self.drops.append(time.perf_counter())
                    return
                if mode == "stall_first" and self.requests == 1:
                    await reader.read()  # until the client gives up and closes
                    self.closed_by_client += 1
                    return
                if mode == "error_first" and self.requests == 1:
                    error = _sse({"error": {"message": "engine died", "type": "internal"}})
                    events = [EVENTS[0], error, DONE]
                    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
                    writer.write(_response(False).split(b"\r\n\r\n")[0] + b"\r\n\r\n")
                    writer.write(body + b"0\r\n\r\n")
                else:
                    writer.write(_response(close=mode == "connection_close"))
                await writer.drain()
                served += 1
                if mode in ("close_after", "connection_close"):
                    return
        finally:
            writer.close()


def _raw(mode: str, prompts: int, timeout_s: float = 30):
    """Send `prompts` requests one by one through one pool to a RawServer in `mode`; the
    server, the results and the pool's count of connections opened."""
    srv = RawServer(mode)

    async def main():
        server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
        pool = None
        try:
            port = server.sockets[0].getsockname()[1]
            endpoint = Endpoint.parse(f"http://127.0.0.1:{port}")
            pool = ConnectionPool(endpoint)
            results = []
            for i in range(prompts):
                payload = _payload("hello")
                results.append(await stream_completion(endpoint, payload, i, None, timeout_s, pool))
                await asyncio.sleep(0.05)  # lets a server's close reach the client, or not
            return results, pool.opened
        finally:
            if pool is not None:
                pool.close()
            server.close()
            await server.wait_closed()

    results, opened = asyncio.run(main())
    return srv, results, opened


@pytest.mark.parametrize("mode", ["close_after", "connection_close"])
@pytest.mark.timeout(60)
def test_a_connection_the_server_closed_is_not_reused(mode):
    srv, results, opened = _raw(mode, 4)
    for r in results:
        _assert_ok(r)
    assert srv.requests == 4 and srv.connections == 4 and opened == 4


@pytest.mark.timeout(60)
def test_a_request_lost_on_a_reused_connection_is_sent_again_once():
    srv, results, opened = _raw("drop_second", 3)
    for r in results:
        _assert_ok(r)
    # conn 1: request 0, request 1 dropped; conn 2: request 1 again, request 2 dropped; conn 3
    assert len(srv.drops) == 2 and srv.connections == 3 and opened == 3
    # the retries were timed from their own start, after the drop
    assert results[1].start >= srv.drops[0] and results[2].start >= srv.drops[1]


@pytest.mark.timeout(60)
def test_a_request_lost_on_a_fresh_connection_is_not_sent_again():
    srv, results, opened = _raw("drop_all", 1)
    (r,) = results
    assert not r.ok and r.error.startswith("IncompleteReadError")
    assert srv.requests == 1 and srv.connections == 1 and opened == 1


@pytest.mark.parametrize(
    "mode, error",
    [
        ("stall_first", "timed out after 0.5s"),
        ("error_first", "ValueError: stream error: engine died"),
    ],
)
@pytest.mark.timeout(60)
def test_after_a_failure_the_connection_is_closed_not_reused(mode, error):
    srv, results, opened = _raw(mode, 3, timeout_s=0.5)
    failed, *rest = results
    assert not failed.ok and failed.error == error
    for r in rest:
        _assert_ok(r)
    # the failed request's connection was closed by the client; the next two shared a new one
    assert srv.connections == 2 and opened == 2 and srv.closed_by_client >= 1
