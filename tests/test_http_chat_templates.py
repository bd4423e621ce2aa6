"""A request's own chat template, with the operator's leave ([router]
trust_request_chat_template, --trust-request-chat-template), compiles and renders in the
router's contained child, bounded: nested loops of 10,000 are a 400 at the
time limit while /health and other streams are served; `'x' * n` and a string doubled
without end are a 400; a benign template renders as before; and a large chat rendered by the
model's own template goes to the child too and renders the same. (Refused without the
operator's leave: tests/test_http_contained.py.) Real router and worker processes, the fake
engine (router/http/chat_templates.py)."""

from __future__ import annotations

import threading

import httpx
import pytest

from splitserve.tokenizers import load_tokenizer
from tests.http_stack import (
    HTTP_TIMEOUT_S,
    assert_error_shape,
    http_stack,
    metric_sum,
    sse_events,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello"}]
# two nested loops of 10,000 (seconds on the event loop when templates rendered there), inside a
# third: no machine finishes it within the time limit, so the 400 comes from the limit for sure
NESTED_LOOPS = ("{% for h in range(10000) %}{% for i in range(10000) %}{% for j in range(10000) %}"
                "{% endfor %}{% endfor %}{% endfor %}{{ messages[0].content }}")  # fmt: skip


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(tokenizer_512, model={"num_slots": 4},
                    router={"trust_request_chat_template": True}) as s:  # fmt: skip
        yield s


def rendered(stack, **body) -> str:
    """The prompt text a chat body renders to (vLLM's /tokenize, then /detokenize)."""
    with stack.http() as c:
        r = c.post("/tokenize", json=body)
        assert r.status_code == 200, r.text
        return c.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]


def contained(stack, outcome: str) -> float:
    return metric_sum(stack.metrics(), "splitserve_contained_jobs_ended_total", outcome=outcome)


def test_a_trusted_template_of_the_request_renders(stack):
    template = "{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}"
    assert rendered(stack, messages=MESSAGES, chat_template=template) == "[user: hello]"


def test_nested_loops_are_a_400_at_the_time_limit_while_health_and_streams_are_served(stack):
    events: list[str] = []
    lock = threading.Lock()
    hostile: dict = {}

    def note(event: str) -> None:
        with lock:
            events.append(event)

    def send_hostile() -> None:
        body = {"messages": MESSAGES, "max_tokens": 4, "chat_template": NESTED_LOOPS}
        hostile["response"] = httpx.post(f"{stack.url}{CHAT}", json=body, timeout=HTTP_TIMEOUT_S)
        note("hostile answered")

    with stack.http() as c:
        body = {"messages": MESSAGES, "max_tokens": 32, "stream": True}
        with c.stream("POST", CHAT, json=body) as stream:  # a stream already running
            assert stream.status_code == 200
            lines = stream.iter_lines()
            first = next(sse_events(lines))
            assert first["choices"][0]["delta"]["role"] == "assistant"
            sender = threading.Thread(target=send_hostile)
            sender.start()
            # the hostile template is being rendered in a contained child
            wait_until(lambda: metric_sum(stack.metrics(), "splitserve_contained_jobs",
                                          state="running") == 1,  # fmt: skip
                       60, "the hostile template on a contained child")
            assert c.get("/health").status_code == 200
            note("health answered")
            rest = list(sse_events(lines))
            note("stream ended")
        sender.join(HTTP_TIMEOUT_S)
    assert rest[-1] == "[DONE]" and rest[-2]["choices"][0]["finish_reason"] == "length"
    err = assert_error_shape(hostile["response"], 400, "chat_template")
    assert err["code"] == "chat_template_too_complex" and "longer than" in err["message"]
    assert events.index("health answered") < events.index("hostile answered"), events
    with stack.http() as c:
        assert c.get("/health").status_code == 200


# a string doubled 48 times: the memory bound stops it, or the time limit if it comes first
@pytest.mark.parametrize("template, code, words", [
    ("{{ 'x' * 10000000000 }}", "chat_template_error", ("repetition",)),
    ("{{ 7 ** 10000000 }}", "chat_template_error", ("power",)),
    ("{% set ns = namespace(s='x') %}{% for i in range(48) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s | length }}", "chat_template_too_complex", ("MemoryError",
                                                                       "longer than")),
    ("{% for %}", "chat_template_error", ("does not compile",)),
    ("{{ raise_exception('no such role') }}", "chat_template_error", ("no such role",)),
])  # fmt: skip
def test_a_template_past_a_bound_or_broken_is_a_400_naming_chat_template(
    stack, template, code, words
):
    pid = stack.router.pid
    with stack.http() as c:
        r = c.post(CHAT, json={"messages": MESSAGES, "max_tokens": 2, "chat_template": template})
        err = assert_error_shape(r, 400, "chat_template")
        assert err["code"] == code and any(w in err["message"] for w in words), err
        assert c.get("/health").status_code == 200
    assert stack.router.pid == pid and stack.router.poll() is None


def test_a_large_chat_renders_the_model_s_own_template_in_the_child_as_here(
    stack, tokenizer_512
):
    tok = load_tokenizer(tokenizer_512)
    messages = [{"role": "user" if i % 2 else "assistant", "content": f"message {i}"}
                for i in range(200)]  # fmt: skip
    for chat, on_child in ((messages, 1), (messages[:2], 0)):  # a small chat renders here
        before = contained(stack, "ok")
        with stack.http() as c:
            r = c.post("/tokenize", json={"messages": chat})
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == tok.encode(tok.apply_chat_template(chat),
                                                add_special_tokens=False)  # fmt: skip
        assert contained(stack, "ok") == before + on_child
