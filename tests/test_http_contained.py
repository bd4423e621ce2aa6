"""One request must not kill the router: grammars that overflow the grammar
engine's native stack (3,000 chained Lark rules; a 3,000-long $ref chain; a schema past no
single bound whose $ref chain runs through deep nesting) each get a 400, and the router process
serves on: the same pid, /health 200, a normal request and a structured one served afterwards.
On the code before the fix each of these requests ended the router with SIGSEGV. Real router and
worker processes, the fake engine (router/http/contained.py, router/contained/)."""

from __future__ import annotations

import json
import signal

import pytest

from tests.hostile_grammars import deep_refs, lark_chain, ref_chain
from tests.http_stack import assert_error_shape, http_stack, metric_sum, sse_events

pytestmark = pytest.mark.timeout(180)

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(tokenizer_512, model={"num_slots": 4}) as s:
        yield s


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def serves_on(stack, pid: int) -> None:
    """The same router process answers /health, a plain stream and a structured request."""
    assert stack.router.poll() is None and stack.router.pid == pid
    with stack.http() as c:
        assert c.get("/health").status_code == 200
        body = {"messages": MESSAGES, "max_tokens": 4, "stream": True}
        with c.stream("POST", CHAT, json=body) as r:
            assert r.status_code == 200
            events = list(sse_events(r.iter_lines()))
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                  "additionalProperties": False}  # fmt: skip
        r = c.post(CHAT, json={"messages": MESSAGES, "max_tokens": 40,
                               "response_format": json_schema(schema)})  # fmt: skip
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["message"]["content"])["n"], int)


@pytest.mark.parametrize("path, field, value", [
    (CHAT, "guided_grammar", lark_chain(3000)),
    ("/v1/completions", "guided_grammar", lark_chain(3000)),
    (CHAT, "response_format", json_schema(ref_chain(3000))),
    ("/v1/completions", "guided_json", ref_chain(3000)),
    ("/generate", "structured_outputs", {"json": ref_chain(3000)}),
])  # fmt: skip
def test_a_grammar_that_would_overflow_the_engine_s_stack_is_a_400_and_the_router_serves_on(
    stack, path, field, value
):
    pid = stack.router.pid
    base = {"messages": MESSAGES} if path == CHAT else {"prompt": "x"}
    with stack.http() as c:
        r = c.post(path, json={**base, field: value, "max_tokens": 4})
    err = assert_error_shape(r, 400, field)
    assert err["code"] == "grammar_too_complex", err
    assert "Traceback" not in err["message"] and len(err["message"]) < 300
    serves_on(stack, pid)


def test_a_crash_of_the_compiler_is_contained_in_a_child_and_counted(stack):
    """deep_refs() passes every cheap bound: the compiler really runs, and its process dies."""
    before = metric_sum(stack.metrics(), "splitserve_contained_jobs_ended_total",
                        outcome="crashed")  # fmt: skip
    pid = stack.router.pid
    with stack.http() as c:
        r = c.post(CHAT, json={"messages": MESSAGES, "max_tokens": 4,
                               "response_format": json_schema(deep_refs())})  # fmt: skip
    err = assert_error_shape(r, 400, "response_format")
    assert err["code"] == "grammar_too_complex"
    assert signal.Signals.SIGSEGV.name in err["message"]
    after = metric_sum(stack.metrics(), "splitserve_contained_jobs_ended_total",
                       outcome="crashed")  # fmt: skip
    assert after == before + 1
    serves_on(stack, pid)


def test_a_required_tool_call_whose_parameters_chain_refs_is_a_400(stack):
    tool = {"type": "function", "function": {"name": "f", "parameters": ref_chain(3000)}}
    pid = stack.router.pid
    with stack.http() as c:
        r = c.post(CHAT, json={"messages": MESSAGES, "max_tokens": 4, "tools": [tool],
                               "tool_choice": "required"})  # fmt: skip
    err = assert_error_shape(r, 400, "tools")
    assert err["code"] == "grammar_too_complex" and "$ref" in err["message"]
    serves_on(stack, pid)


@pytest.mark.parametrize("path, extra", [
    (CHAT, {"max_tokens": 4}),
    ("/tokenize", {}),
])  # fmt: skip
def test_a_request_s_own_chat_template_is_refused_unless_the_operator_allows_it(
    stack, path, extra
):
    body = {"messages": MESSAGES, "chat_template": "{{ messages[0].content }}", **extra}
    with stack.http() as c:
        err = assert_error_shape(c.post(path, json=body), 400, "chat_template")
    assert err["code"] == "chat_template_not_allowed"
    assert "--trust-request-chat-template" in err["message"]
