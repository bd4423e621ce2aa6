"""The OpenAI-compatible HTTP API end to end: real worker processes, a real router process, the
fake engine (whose output is worked out by hand) and the official openai client.

One stack serves the whole module. Its admission is tight (8 running, no queue) so that overload
is easy to provoke; its fake decode step takes 10 ms so that a long request is still running when
a test disconnects from it.
"""

from __future__ import annotations

import concurrent.futures
import re
import time

import httpx
import openai
import pytest

from splitserve.engine.fake.engine import fake_logprob
from splitserve.tokenizers import load_tokenizer
from tests.http_stack import (
    assert_error_shape,
    http_stack,
    metric_sum,
    sse_events,
    wait_until,
)
from tests.pipeline_util import expected_fake_tokens

pytestmark = pytest.mark.timeout(120)

NUM_SLOTS = 8
STEP_S = 0.01


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(
        tokenizer_512,
        model={"fake_step_s": STEP_S, "num_slots": NUM_SLOTS},
        router={"max_running": NUM_SLOTS, "max_queued": 0},
    ) as s:
        yield s


@pytest.fixture(scope="module")
def tok(tokenizer_512):
    return load_tokenizer(tokenizer_512)


@pytest.fixture(scope="module")
def model(stack):
    return stack.openai().models.list().data[0].id


def expected(tok, prompt_ids, max_tokens, ignore_eos=False):
    """(text, token ids, finish reason) the fake engine must produce for this prompt."""
    tokens, reason = expected_fake_tokens(
        prompt_ids, tok.vocab_size, max_tokens, tok.eos_ids, ignore_eos
    )
    visible = tokens[:-1] if reason == "stop" else tokens
    return tok.decode(visible, skip_special_tokens=True), tokens, reason


def same_usage(a, b) -> bool:
    """Equal but for cached_tokens: a repeated prompt finds its prefix cached the second time."""
    skip = {"prompt_tokens_details"}
    return a.model_dump(exclude=skip) == b.model_dump(exclude=skip)


def chat_prompt(tok, messages):
    return tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)


def assert_idle(stack, timeout_s=3.0):
    """No request running and every decode slot free again."""

    def idle():
        m = stack.metrics()
        return (
            metric_sum(m, "vllm:num_requests_running") == 0
            and metric_sum(m, "splitserve_decode_free_slots") == NUM_SLOTS
        )

    wait_until(idle, timeout_s, "no request running and every slot free")


# ---- operator endpoints ----------------------------------------------------------------------


def test_health_names_every_worker(stack):
    r = httpx.get(f"{stack.url}/health", timeout=10)
    assert r.status_code == 200
    body = r.json()
    states = {(w["role"], w["index"]): w["state"] for w in body["workers"]}
    assert states == {
        ("prefill", 0): "ready",
        ("decode", 0): "ready",
        ("detok", 0): "ready",
        ("detok", 1): "ready",
    }


def test_models_lists_the_served_model(stack, model):
    assert model == "SmolLM2-135M-Instruct"  # a short name, not the default model's file name
    assert stack.openai().models.retrieve(model).id == model
    # the file name (what earlier versions served) is still accepted, answered as the short name
    assert stack.openai().models.retrieve("SmolLM2-135M-Instruct.Q4_1.gguf").id == model


def test_metrics_parse_and_counters_move(stack, tok, model):
    before = stack.metrics()
    prompt = "count these"
    for _ in range(2):
        stack.openai().completions.create(
            model=model, prompt=prompt, max_tokens=5, extra_body={"ignore_eos": True}
        )
    after = stack.metrics()

    def moved(name, **labels):
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    assert moved("vllm:request_success_total", finished_reason="length", model_name=model) == 2
    assert moved("vllm:generation_tokens_total") == 10
    assert moved("vllm:prompt_tokens_total") == 2 * len(tok.encode(prompt))
    assert moved("vllm:time_to_first_token_seconds_count") == 2
    assert moved("vllm:e2e_request_latency_seconds_count") == 2
    r = httpx.get(f"{stack.url}/metrics", timeout=10)
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    # worker figures come with heartbeats: the two prefills (and the 2 x 4 tokens the decode
    # worker made after them) show up within a few beats
    def grew(samples, name):
        return metric_sum(samples, name) - metric_sum(before, name)

    def caught_up(samples):
        return (grew(samples, "splitserve_prefill_seconds_count") >= 2
                and grew(samples, "splitserve_decode_tokens_total") >= 8)  # fmt: skip

    deadline = time.monotonic() + 10
    while not caught_up(stack.metrics()) and time.monotonic() < deadline:
        time.sleep(0.1)
    latest = stack.metrics()
    assert caught_up(latest)  # >=: an earlier test's figures may still lag in `before`
    assert metric_sum(latest, "splitserve_prefill_seconds_recent", quantile="0.5") > 0
    assert metric_sum(latest, "splitserve_decode_steps_total") >= 4
    assert metric_sum(latest, "splitserve_decode_slots") >= 1


# ---- completions ------------------------------------------------------------------------------


def test_completion_is_the_fake_engines_output(stack, tok, model):
    prompt = "The quick brown fox"
    ids = tok.encode(prompt)
    out = stack.openai().completions.create(model=model, prompt=prompt, max_tokens=24)
    text, tokens, reason = expected(tok, ids, 24)
    assert out.object == "text_completion" and out.model == model
    assert [c.index for c in out.choices] == [0]
    assert out.choices[0].text == text
    assert out.choices[0].finish_reason == reason
    assert out.usage.prompt_tokens == len(ids)
    assert out.usage.completion_tokens == len(tokens)
    assert out.usage.total_tokens == len(ids) + len(tokens)


def test_default_max_tokens_is_16(stack, tok, model):
    out = stack.openai().completions.create(
        model=model, prompt="defaults", extra_body={"ignore_eos": True}
    )
    assert out.usage.completion_tokens == 16
    assert out.choices[0].finish_reason == "length"


def test_streamed_completion_equals_non_streamed(stack, tok, model):
    client = stack.openai()
    args = dict(model=model, prompt="streams must agree", max_tokens=40, seed=1234, temperature=0.7)
    full = client.completions.create(**args)
    chunks = list(
        client.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    *body, last = chunks
    assert "".join(c.choices[0].text for c in body) == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in body if c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert all(c.usage is None for c in body)
    assert last.choices == [] and same_usage(last.usage, full.usage)
    assert len({c.id for c in chunks}) == 1


def test_continuous_usage_stats(stack, tok, model):
    payload = {
        "prompt": "usage everywhere",
        "max_tokens": 12,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
    }
    with stack.http() as c, c.stream("POST", "/v1/completions", json=payload) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    completion = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 12
    n_prompt = len(tok.encode("usage everywhere"))
    assert all(c["usage"]["prompt_tokens"] == n_prompt for c in chunks)


def test_n_choices_and_prompt_lists(stack, tok, model):
    client = stack.openai()
    prompts = ["first prompt", "second one"]
    out = client.completions.create(
        model=model, prompt=prompts, n=2, max_tokens=6, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    for c in out.choices:
        assert c.text == expected(tok, tok.encode(prompts[c.index // 2]), 6, True)[0]
    assert out.usage.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)
    assert out.usage.completion_tokens == 4 * 6

    ids = [[5, 6, 7], [300, 2, 9, 11]]
    out = client.completions.create(model=model, prompt=ids, max_tokens=5)
    for c in out.choices:
        assert c.text == expected(tok, ids[c.index], 5)[0]
    out = client.completions.create(model=model, prompt=ids[1], max_tokens=5)
    assert out.choices[0].text == expected(tok, ids[1], 5)[0]

    stream = client.completions.create(
        model=model, prompt=prompts, n=2, max_tokens=6, stream=True, extra_body={"ignore_eos": True}
    )
    texts, finishes = {}, {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes[c.index] = finishes.get(c.index, 0) + 1
    assert finishes == {0: 1, 1: 1, 2: 1, 3: 1}  # exactly one finishing chunk per choice
    assert texts == {i: expected(tok, tok.encode(prompts[i // 2]), 6, True)[0] for i in range(4)}


def test_stop_strings(stack, tok, model):
    client = stack.openai()
    prompt = "where to stop"
    full, _, _ = expected(tok, tok.encode(prompt), 80, ignore_eos=True)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip()
    cut = full.index(stop)
    base = dict(model=model, prompt=prompt, max_tokens=80)
    out = client.completions.create(**base, stop=stop, extra_body={"ignore_eos": True})
    assert out.choices[0].text == full[:cut]
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens < 80
    out = client.completions.create(
        **base, stop=["\x00never", stop],
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
    )  # fmt: skip
    assert out.choices[0].text == full[: cut + len(stop)]
    streamed = client.completions.create(
        **base, stop=[stop], stream=True, extra_body={"ignore_eos": True}
    )
    assert "".join(c.choices[0].text for c in streamed) == full[:cut]


def test_completion_logprobs(stack, tok, model):
    prompt = "log probabilities"
    _, tokens, _ = expected(tok, tok.encode(prompt), 10, ignore_eos=True)
    out = stack.openai().completions.create(
        model=model, prompt=prompt, max_tokens=10, logprobs=1, extra_body={"ignore_eos": True}
    )
    lp = out.choices[0].logprobs
    want = [fake_logprob(t, tok.vocab_size) for t in tokens]
    assert lp.token_logprobs == pytest.approx(want, abs=1e-6)
    assert len(lp.tokens) == len(lp.text_offset) == len(lp.top_logprobs) == 10
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(len(d) == 1 for d in lp.top_logprobs)


# ---- chat -------------------------------------------------------------------------------------


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something about streams."},
]


def test_chat_renders_the_template_and_streams_the_same_text(stack, tok, model):
    client = stack.openai()
    ids = chat_prompt(tok, MESSAGES)
    text, tokens, reason = expected(tok, ids, 30)
    full = client.chat.completions.create(
        model=model, messages=MESSAGES, max_completion_tokens=30, seed=5
    )
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content == text
    assert full.choices[0].finish_reason == reason
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (len(ids), len(tokens))

    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_completion_tokens=30, seed=5, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    *body, last = chunks
    assert body[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in body) == text
    assert [c.choices[0].finish_reason for c in body if c.choices[0].finish_reason] == [reason]
    assert last.choices == [] and same_usage(last.usage, full.usage)


def test_chat_n_and_max_tokens(stack, tok, model):
    client = stack.openai()
    ids = chat_prompt(tok, MESSAGES)
    out = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=7, n=3, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    want = expected(tok, ids, 7, ignore_eos=True)[0]
    assert all(c.message.content == want for c in out.choices)
    assert out.usage.completion_tokens == 21 and out.usage.prompt_tokens == len(ids)

    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_completion_tokens=4, n=2, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    first_delta, finishes = {}, {}
    for chunk in stream:
        for c in chunk.choices:
            first_delta.setdefault(c.index, c.delta)
            if c.finish_reason:
                finishes[c.index] = finishes.get(c.index, 0) + 1
    assert {i: d.role for i, d in first_delta.items()} == {0: "assistant", 1: "assistant"}
    assert finishes == {0: 1, 1: 1}


def test_chat_logprobs(stack, tok, model):
    ids = chat_prompt(tok, MESSAGES)
    _, tokens, _ = expected(tok, ids, 8, ignore_eos=True)
    out = stack.openai().chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=8, logprobs=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    content = out.choices[0].logprobs.content
    want = [fake_logprob(t, tok.vocab_size) for t in tokens]
    assert [e.logprob for e in content] == pytest.approx(want, abs=1e-6)
    assert all(e.top_logprobs == [] for e in content)
    joined = b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace")
    assert joined == out.choices[0].message.content


# ---- native /generate -------------------------------------------------------------------------


def test_generate_text_and_token_ids(stack, tok):
    ids = [17, 4, 250]
    text, tokens, _ = expected(tok, ids, 12, ignore_eos=True)
    with stack.http() as c:
        r = c.post(
            "/generate", json={"prompt_token_ids": ids, "max_tokens": 12, "ignore_eos": True}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["text"], body["token_ids"], body["finish_reason"]) == (text, tokens, "length")
        assert body["usage"]["completion_tokens"] == 12

        payload = {"prompt": "native text", "max_tokens": 9, "stream": True, "logprobs": True}
        with c.stream("POST", "/generate", json=payload) as r:
            events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    text, tokens, reason = expected(tok, tok.encode("native text"), 9)
    assert "".join(e["text"] for e in events[:-1]) == text
    assert [t for e in events[:-1] for t in e["token_ids"]] == tokens
    assert [e["finish_reason"] for e in events[:-1] if e["finish_reason"]] == [reason]
    assert sum(len(e["logprobs"]) for e in events[:-1]) == len(tokens)


# ---- request ids ------------------------------------------------------------------------------


def test_request_id_is_used_and_echoed(stack, model):
    with stack.http() as c:
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert len(r.headers["x-request-id"]) >= 16  # generated
        rid = "client-chosen-id-42"
        r = c.post(
            "/v1/completions",
            json={"prompt": "hi", "max_tokens": 2, "n": 2},
            headers={"X-Request-Id": rid},
        )
        assert r.status_code == 200
        assert r.headers["x-request-id"] == rid and r.json()["id"] == f"cmpl-{rid}"
    # the workers' ids of its choices: the client's id, the router's own tag, the choice
    core = [re.escape(rid) + r"\.[0-9a-f]{8}-" + str(i) for i in range(2)]
    with open(f"{stack.logs()}/router-0.log") as fh:
        log = fh.read()
    assert all(re.search(c + " admitted", log) for c in core)
    # every process that handled the request logged its id
    for name in ("prefill-0", "decode-0"):
        with open(f"{stack.logs()}/{name}.log") as fh:
            log = fh.read()
        assert all(re.search(c + " ", log) for c in core), name
    detok_logs = ""
    for k in range(stack.config.detok_count):
        with open(f"{stack.logs()}/detok-{k}.log") as fh:
            detok_logs += fh.read()
    assert all(re.search(c + " stream opened", detok_logs) for c in core)


def test_duplicate_in_flight_request_id_is_refused(stack):
    rid = "dup-id-1"
    long = {"prompt": "long", "max_tokens": 300, "ignore_eos": True, "stream": True}
    with stack.http() as c:
        with c.stream("POST", "/v1/completions", json=long, headers={"X-Request-Id": rid}) as r:
            lines = r.iter_lines()  # (dropping this iterator would close the connection)
            next(lines)  # it is running
            again = c.post("/v1/completions", json={"prompt": "x"}, headers={"X-Request-Id": rid})
            err = assert_error_shape(again, 400)
            assert err["code"] == "duplicate_request_id"
            assert again.headers["x-request-id"] == rid
    assert_idle(stack)
    # once it is over, the id may be used again at once (the workers still remember the old one)
    with stack.http() as c:
        for _ in range(2):
            r = c.post(
                "/v1/completions", json={"prompt": "x", "n": 2}, headers={"X-Request-Id": rid}
            )
            assert r.status_code == 200, r.text
            assert r.headers["x-request-id"] == rid and r.json()["id"] == f"cmpl-{rid}"


# ---- hostile input ----------------------------------------------------------------------------

LONG = list(range(1, 600))
CHAT = "/v1/chat/completions"


def raw(content: bytes, param=None, status=400, path="/v1/completions"):
    return (path, {"content": content}, status, param)


def completion(param, status=400, **fields):
    return ("/v1/completions", {"json": {"prompt": "x", **fields}}, status, param)


def chat(param, **fields):
    return (CHAT, {"json": {"messages": MESSAGES, **fields}}, 400, param)


BAD_INPUT = [  # (path, request kwargs, status, param)
    raw(b'{"prompt": "x",'),
    raw(b'{"prompt": "\xff"}'),  # not UTF-8
    raw(b"[" * 100_000 + b"]" * 100_000),  # nested past the parser's recursion limit
    raw(b'{"prompt":"x","max_tokens":' + b"9" * 5000 + b"}"),  # past int parsing's digit limit
    raw(b'{"prompt":"x","temperature":NaN}', "temperature"),
    raw(b""),
    raw(b"[1, 2]"),
    raw(b"{}", "prompt"),
    raw(b"x" * (9 << 20), status=413),
    completion("prompt", prompt=123),
    completion("prompt", prompt=[1.5]),
    completion("prompt", prompt=[True]),
    completion("prompt", prompt=[]),
    completion("prompt", prompt=[[]]),
    completion("prompt", prompt=[-1]),
    completion("prompt", prompt=[100_000]),
    completion("prompt", prompt=LONG),  # longer than the 512-token context
    completion("prompt", prompt="word " * 3000),
    completion("max_tokens", max_tokens="16"),
    completion("max_tokens", max_tokens=0),
    completion("max_tokens", max_tokens=10**30),
    completion("temperature", temperature=-1),
    completion("temperature", temperature="hot"),
    completion("top_p", top_p=0),
    completion("n", n=0),
    completion("n", n=17),
    completion("n", n=16, prompt=["a"] * 9),  # 144 choices
    completion("logprobs", logprobs=21),
    completion("logprobs", logprobs=True),
    completion("seed", seed=-1),
    completion("seed", seed=2**64),
    completion("stop", stop=["s"] * 17),
    completion("stop", stop=[""]),
    completion("stop", stop=5),
    completion("stop_token_ids", stop_token_ids=[-1]),
    completion("stop_token_ids", stop_token_ids=[10**6]),
    completion("min_tokens", min_tokens=20),  # more than max_tokens (16)
    completion("stream", stream="yes"),
    completion("stream_options", stream_options={"include_usage": True}),  # without stream
    completion("model", model="gpt-9"),
    completion("presence_penalty", presence_penalty=2.5),
    completion("suffix", suffix="fill in the middle"),
    completion("use_beam_search", use_beam_search=True),
    completion("no_such_field", no_such_field=1),  # refused, never ignored
    completion("max_tokens", max_tokens=600),  # beyond the 512-token context: no clamp
    completion(None, status=429, n=16),  # 8 slots and no queue: overloaded
    (CHAT, {"json": {"messages": []}}, 400, "messages"),
    (CHAT, {"json": {"messages": "hi"}}, 400, "messages"),
    (CHAT, {"json": {"messages": [{"role": "robot", "content": "x"}]}}, 400, "messages"),
    (
        CHAT,
        {"json": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}},
        400,
        "messages",
    ),
    chat("top_logprobs", top_logprobs=2),  # without logprobs
    chat("max_completion_tokens", max_completion_tokens=0),
    chat("tools", tools=[{"type": "function"}]),
    chat("model", model="gpt-9"),
    ("/generate", {"json": {"prompt": "x", "prompt_token_ids": [1]}}, 400, "prompt_token_ids"),
    ("/generate", {"json": {"max_tokens": 3}}, 400, "prompt_token_ids"),
    ("/generate", {"json": {"prompt": "x", "n": 2}}, 400, "n"),
    ("/v1/completions", {"json": {"prompt": "x"}, "headers": {"X-Request-Id": "a b"}}, 400, None),
    (
        "/v1/completions",
        {"json": {"prompt": "x"}, "headers": {"X-Request-Id": "a" * 200}},
        400,
        None,
    ),
    ("/v1/nothing", {"json": {}}, 404, None),
]


def test_hostile_input_gets_documented_errors_and_the_stack_keeps_serving(stack, model):
    with stack.http() as c:
        for path, kwargs, status, param in BAD_INPUT:
            r = c.post(path, **kwargs)
            assert_error_shape(r, status, param)
        assert_error_shape(c.get("/v1/completions"), 405)
    assert_idle(stack)
    assert httpx.get(f"{stack.url}/health", timeout=10).status_code == 200
    out = stack.openai().completions.create(model=model, prompt="still alive", max_tokens=3)
    assert out.usage.completion_tokens >= 1


def test_chunked_body_over_the_limit_is_refused(stack):
    def chunks():
        for _ in range(10):
            yield b" " * (1 << 20)

    with stack.http() as c:
        r = c.post("/v1/completions", content=chunks())
        assert_error_shape(r, 413)


# ---- disconnects ------------------------------------------------------------------------------


def test_disconnect_mid_stream_aborts_the_request(stack):
    assert_idle(stack)
    before = stack.metrics()
    # 400 tokens at 10 ms a step: 4 s if it ran to the end
    payload = {"prompt": "abandon me", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with stack.http() as c, c.stream("POST", "/v1/completions", json=payload) as r:
        events = sse_events(r.iter_lines())
        for _ in range(3):
            assert isinstance(next(events), dict)
        closed_at = time.monotonic()
    assert_idle(stack, timeout_s=1.5)
    assert time.monotonic() - closed_at < 2.0
    after = stack.metrics()
    aborted = {"name": "vllm:request_success_total", "finished_reason": "abort"}
    assert metric_sum(after, **aborted) - metric_sum(before, **aborted) == 1
    assert httpx.get(f"{stack.url}/health", timeout=10).json()["running"] == 0


def test_disconnect_while_waiting_for_a_non_streamed_response_aborts(stack):
    assert_idle(stack)
    before = stack.metrics()
    payload = {"prompt": "impatient", "max_tokens": 400, "ignore_eos": True}
    with stack.http(timeout=httpx.Timeout(10, read=0.5)) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/completions", json=payload)
    assert_idle(stack, timeout_s=1.5)
    aborted = {"name": "vllm:request_success_total", "finished_reason": "abort"}
    assert metric_sum(stack.metrics(), **aborted) - metric_sum(before, **aborted) == 1


def test_concurrent_clients(stack, tok, model):
    prompts = [f"client number {i}" for i in range(NUM_SLOTS)]

    def one(p):
        return stack.openai().completions.create(
            model=model, prompt=p, max_tokens=20, stream=False, extra_body={"ignore_eos": True}
        )

    with concurrent.futures.ThreadPoolExecutor(NUM_SLOTS) as pool:
        outs = list(pool.map(one, prompts))
    for p, out in zip(prompts, outs, strict=True):
        assert out.choices[0].text == expected(tok, tok.encode(p), 20, True)[0]


def test_openai_client_raises_on_bad_request(stack, model):
    with pytest.raises(openai.BadRequestError) as info:
        stack.openai().completions.create(model=model, prompt="x", temperature=7)
    assert info.value.body["param"] == "temperature"
