"""Every client input ends in a clear 4xx and leaks nothing: lone UTF-16 surrogates in
any string of the body, a client that leaves while its body uploads, and numbers the float32
sampler cannot honour. Real worker processes and router process, the fake engine, raw sockets
where a client must misbehave in ways httpx will not."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import socket
import uuid

import httpx
import pytest

from tests.http_stack import assert_error_shape, http_stack, metric_sum, wait_until

pytestmark = pytest.mark.timeout(120)

NUM_SLOTS = 4
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(
        tokenizer_512,
        model={"num_slots": NUM_SLOTS},
        router={"max_running": NUM_SLOTS, "max_queued": 0},
    ) as s:
        yield s


def router_log(stack) -> str:
    with open(os.path.join(stack.logs(), "router-0.log"), errors="replace") as fh:
        return fh.read()


def assert_idle(stack, timeout_s: float = 10.0) -> None:
    wait_until(lambda: metric_sum(stack.metrics(), "vllm:num_requests_running") == 0, timeout_s,
               "no request running")  # fmt: skip


def connect(stack) -> http.client.HTTPConnection:
    host, port = stack.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.connect()
    return conn


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, dict, str]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    return r.status, dict(r.getheaders()), json.loads(text) if text else {}


# ---- lone surrogates ------------------------------------------------------------------------

# (path, raw JSON body, the param the 400 names); "\\udfff" is JSON's escape for U+DFFF
SURROGATES = [
    ("/v1/completions", rb'{"prompt":"hello","max_tokens":4,"stop":["\udfff"]}', "stop"),
    ("/v1/completions", rb'{"prompt":"hello","max_tokens":4,"stop":"\ud800"}', "stop"),
    ("/v1/completions", rb'{"prompt":"hi \udfff","max_tokens":2}', "prompt"),
    ("/v1/completions", rb'{"prompt":["fine","\udbff"],"max_tokens":2}', "prompt"),
    ("/v1/completions", rb'{"prompt":"x","max_tokens":2,"user":"\udfff"}', "user"),
    ("/v1/completions", rb'{"prompt":"x","max_tokens":2,"model":"\udfff"}', "model"),
    ("/v1/completions", rb'{"prompt":"x","max_tokens":2,"\udfff":1}', "\\udfff"),  # a key
    ("/v1/completions", rb'"\udfff"', None),  # the whole body
    (CHAT, rb'{"messages":[{"role":"user","content":"\ud800x"}],"max_tokens":2}', "messages"),
    (CHAT, rb'{"messages":[{"role":"user","content":[{"type":"text","text":"\udfff"}]}]}',
     "messages"),
    (CHAT, rb'{"messages":[{"role":"user","content":"hi","name":"\udfff"}]}', "messages"),
    ("/generate", rb'{"prompt":"\udfff","max_tokens":2}', "prompt"),
    ("/generate", rb'{"prompt_token_ids":[1],"stop":["a","\udc00"]}', "stop"),
]  # fmt: skip


@pytest.mark.parametrize("path, body, param", SURROGATES)
def test_a_lone_surrogate_is_a_400_naming_its_field_on_a_live_connection(stack, path, body, param):
    conn = connect(stack)
    sock = conn.sock
    try:
        status, headers, err = post(conn, path, body)
        assert status == 400, err
        assert err["error"]["param"] == param
        assert err["error"]["code"] == "invalid_unicode"
        assert "surrogate" in err["error"]["message"]
        assert headers.get("connection") != "close"
        # the same connection serves the next request (a 500 from an exception used to reset it)
        status, _, ok = post(conn, "/v1/completions", b'{"prompt":"x","max_tokens":2}')
        assert status == 200, ok
        assert conn.sock is sock
    finally:
        conn.close()


def test_surrogate_pairs_are_text_not_errors(stack):
    """A pair is one character (json.dumps writes emoji so): served, not refused."""
    conn = connect(stack)
    try:
        status, _, out = post(conn, "/v1/completions",
                              rb'{"prompt":"smile \ud83d\ude00","max_tokens":2,"stop":["\ud83d\ude00"]}')  # noqa: E501
        assert status == 200, out
    finally:
        conn.close()


def test_a_utf8_encoded_surrogate_is_malformed_json(stack):
    with stack.http() as c:
        r = c.post("/v1/completions", content=b'{"prompt":"\xed\xbf\xbf"}')
    err = assert_error_shape(r, 400, None)
    assert err["code"] == "invalid_json"


def test_sixteen_surrogate_stops_leave_admission_free(stack):
    """Each such request once answered 500 and kept its admission place
    until request_timeout_s, so that a handful of them froze the server."""
    conn = connect(stack)
    try:
        for _ in range(16):
            status, _, err = post(
                conn, "/v1/completions", rb'{"prompt":"hello","max_tokens":4,"stop":["\udfff"]}'
            )
            assert status == 400, err
    finally:
        conn.close()
    assert metric_sum(stack.metrics(), "vllm:num_requests_running") == 0

    def one(i: int) -> int:
        with stack.http() as c:
            return c.post("/v1/completions", json={"prompt": f"after {i}", "max_tokens": 4}
                          ).status_code  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(NUM_SLOTS) as pool:
        assert list(pool.map(one, range(NUM_SLOTS))) == [200] * NUM_SLOTS


# ---- a client gone mid-upload ----------------------------------------------------------------


def test_a_client_gone_mid_upload_is_one_quiet_log_line(stack):
    before = len(router_log(stack))
    host, port = stack.url.removeprefix("http://").split(":")
    rids = [f"upload-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for rid in rids:
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"X-Request-Id: " + rid.encode() + b"\r\nContent-Length: 1000\r\n\r\n"
                b'{"prompt": "hel'
            )
            s.shutdown(socket.SHUT_WR)  # gone before the other 985 bytes
    wait_until(lambda: all(f"{rid}: HTTP 499" in router_log(stack) for rid in rids), 30,
               "a 499 line for each client")  # fmt: skip
    new = router_log(stack)[before:]
    assert "Traceback" not in new and " ERROR " not in new, new
    assert_idle(stack)
    assert httpx.post(f"{stack.url}/v1/completions", json={"prompt": "x"}, timeout=30
                      ).status_code == 200  # fmt: skip


# ---- numbers the sampler cannot honour -------------------------------------------------------


def test_a_tiny_top_p_and_a_top_k_beyond_the_vocabulary_are_served(stack):
    """Resolved to what the sampler runs exactly (see router/params.py), and accepted all the way
    to the workers' decoders."""
    with stack.http() as c:
        for extra in ({"top_p": 1e-40}, {"top_p": 5e-324}, {"top_k": 1 << 20}, {"top_k": 513}):
            r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, **extra})
            assert r.status_code == 200, (extra, r.text)
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_temperature_that_would_overflow_float32_is_refused(stack):
    with stack.http() as c:
        r = c.post("/v1/completions", json={"prompt": "x", "temperature": 1e-30})
    err = assert_error_shape(r, 400, "temperature")
    assert "0.0 or in [1e-12" in err["message"]
    assert_idle(stack)
