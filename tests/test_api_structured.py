"""Structured output against a real stack (worker processes, the router, the fake engine) with
the official openai client, LangChain and LiteLLM: whatever the fake engine's arithmetic would
write, the grammar makes it valid, so every output that ends with `stop` validates against its
schema (jsonschema), over a corpus of schemas and many prompts, on chat and completions, in
every form the APIs give a grammar in; invalid grammars are a 400 naming the field."""

from __future__ import annotations

import concurrent.futures
import json
import re

import jsonschema
import pytest
import zmq

from splitserve import protocol
from splitserve.grammar import specs
from splitserve.grammar.matcher import GrammarState
from splitserve.grammar.vocabulary import grammar_tokenizer
from splitserve.protocol import RequestFailed
from splitserve.tokenizers import load_tokenizer
from tests.http_stack import assert_error_shape, http_stack, sse_events, wait_until
from tests.schema_corpus import SCHEMAS

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 400
PROMPTS = ["Describe it as JSON.", "Another one, please", "x", "Fill the form: 1 2 3"]


@pytest.fixture(scope="module")
def stack(tokenizer_8000):
    with http_stack(tokenizer_8000, model={"num_slots": 8, "max_seq_len": 1024}) as s:
        yield s


@pytest.fixture(scope="module")
def prefix_of(tokenizer_8000):
    """prefix_of(schema, text): text is the start of some output valid against schema (the
    grammar engine reads it byte by byte, whatever its tokenization)."""
    tok = load_tokenizer(tokenizer_8000)
    vocab = grammar_tokenizer(tok, tok.vocab_size)

    def check(schema, text):
        state = GrammarState(vocab, specs.from_json_schema(schema), tok.eos_ids)
        state.replay(tok.encode(text, add_special_tokens=False))  # raises if it breaks it
        return True

    return check


def validator(schema):
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def chat_json(client, model, schema, prompt):
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "answer", "schema": schema, "strict": True}},
    )  # fmt: skip
    return out.choices[0].message.content, out.choices[0].finish_reason


def test_chat_output_is_valid_against_every_schema_of_the_corpus(client, model, prefix_of):
    jobs = [(name, prompt) for name in SCHEMAS for prompt in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # several constrained slots a step
        results = list(pool.map(lambda j: chat_json(client, model, SCHEMAS[j[0]], j[1]), jobs))
    stopped = 0
    for (name, prompt), (text, reason) in zip(jobs, results, strict=True):
        if reason == "stop":
            stopped += 1
            validator(SCHEMAS[name]).validate(json.loads(text))
        else:
            assert reason == "length", (name, prompt, reason)
            assert prefix_of(SCHEMAS[name], text)
    # the proof needs outputs that finished: most must have (bounded schemas end soon)
    assert stopped >= 0.75 * len(jobs), (stopped, len(jobs))


@pytest.mark.parametrize("name", ["person", "recursive", "any_of", "top_level_enum"])
def test_completions_take_response_format_too(client, model, name):
    out = client.completions.create(
        model=model, prompt="JSON:", max_tokens=MAX_TOKENS,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {
            "name": name, "schema": SCHEMAS[name]}}},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    validator(SCHEMAS[name]).validate(json.loads(out.choices[0].text))


def test_json_object_mode_writes_an_object(client, model, prefix_of):
    """The fake engine's free-form objects rarely end before max_tokens: what it wrote is the
    start of an object, and an object when it did end."""
    for prompt in PROMPTS:
        choice = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS,
            response_format={"type": "json_object"},
        ).choices[0]  # fmt: skip
        text = choice.message.content
        assert text.startswith("{") and prefix_of({"type": "object"}, text)
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_streamed_constrained_output_is_the_same_text(client, model):
    schema = SCHEMAS["array_of_objects"]
    text, _ = chat_json(client, model, schema, "stream it")
    chunks = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "stream it"}], max_tokens=MAX_TOKENS,
        stream=True, response_format={"type": "json_schema",
                                      "json_schema": {"name": "a", "schema": schema}},
    )  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


@pytest.mark.parametrize("extra, check", [
    ({"guided_choice": ["alpha", "beta", "gamma"]}, lambda t: t in ("alpha", "beta", "gamma")),
    ({"guided_regex": r"[a-c]{2,4}-\d{2}"}, lambda t: re.fullmatch(r"[a-c]{2,4}-\d{2}", t)),
    ({"guided_json": SCHEMAS["person"]}, lambda t: validator(SCHEMAS["person"]).validate(
        json.loads(t)) is None),
    ({"guided_grammar": 'root ::= "yes" | "no" | "it depends"'},
     lambda t: t in ("yes", "no", "it depends")),
    ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
    ({"structured_outputs": {"regex": "[0-9]{3}"}}, lambda t: re.fullmatch("[0-9]{3}", t)),
    ({"structured_outputs": {"json": SCHEMAS["enum"]}}, lambda t: json.loads(t)["color"]),
    ({"structured_outputs": {"grammar": 'start: "left" | "right"'}},
     lambda t: t in ("left", "right")),
])  # fmt: skip
def test_vllm_forms_constrain_completions_and_chat(client, model, extra, check):
    for prompt in PROMPTS[:2]:
        out = client.completions.create(model=model, prompt=prompt, max_tokens=60,
                                        extra_body=extra)  # fmt: skip
        assert out.choices[0].finish_reason == "stop" and check(out.choices[0].text)
        out = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=60,
            extra_body=extra,
        )  # fmt: skip
        assert out.choices[0].finish_reason == "stop" and check(out.choices[0].message.content)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "intger"}}}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format"),
    # a keyword the grammar engine cannot enforce is refused, not dropped
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/completions", {"guided_regex": "[a-"}, "guided_regex"),
    ("/v1/completions", {"guided_choice": []}, "guided_choice"),
    ("/v1/completions", {"guided_grammar": "start: nothing_defined"}, "guided_grammar"),
    ("/v1/completions", {"structured_outputs": {"json": {"type": "object"}, "regex": "a"}},
     "structured_outputs"),
    ("/v1/completions", {"structured_outputs": {"structural_tag": "x"}}, "structured_outputs"),
    ("/v1/completions", {"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
    ("/v1/completions", {"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ("/v1/completions", {"guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
])  # fmt: skip
def test_an_invalid_grammar_is_a_400_naming_its_field(stack, path, body, param):
    base = {"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"}
    with stack.http() as c:
        assert_error_shape(c.post(path, json={**base, **body}), 400, param)


def test_the_openai_client_parse_helper_returns_the_model(client, model):
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=130)

    out = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": "a person"}], max_tokens=MAX_TOKENS,
        response_format=Person,
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(out.choices[0].message.parsed, Person)


def test_langchain_with_structured_output(stack, model):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Joke(BaseModel):
        """A joke."""

        setup: str = Field(max_length=20)
        rating: int = Field(ge=1, le=10)

    llm = ChatOpenAI(model=model, base_url=f"{stack.url}/v1", api_key="x", max_tokens=MAX_TOKENS,
                     max_retries=0, timeout=30)  # fmt: skip
    # json_schema: response_format; function_calling: a tool call required by name. Strict: a
    # schema that allows other properties lets the fake engine write them without end
    for method in ("json_schema", "function_calling"):
        structured = llm.with_structured_output(Joke, method=method, strict=True)
        assert isinstance(structured.invoke("Tell me a joke"), Joke)


def test_litellm_json_mode(stack, model):
    import litellm

    schema = SCHEMAS["person"]
    out = litellm.completion(
        model=f"openai/{model}", api_base=f"{stack.url}/v1", api_key="x", max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": "a person"}], timeout=30,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    validator(schema).validate(json.loads(out.choices[0].message.content))
    out = litellm.completion(
        model=f"openai/{model}", api_base=f"{stack.url}/v1", api_key="x", max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": "JSON please"}], timeout=30,
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert out.choices[0].message.content.startswith("{")


def test_the_native_endpoint_takes_a_grammar_too(stack):
    with stack.http() as c:
        r = c.post("/generate", json={"prompt": "pick", "max_tokens": 20,
                                      "guided_choice": ["north", "south"]})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["text"] in ("north", "south") and r.json()["finish_reason"] == "stop"


@pytest.mark.parametrize("extra", [{"guided_regex": r"\d+"},
                                   {"structured_outputs": {"regex": r"\d+"}}])  # fmt: skip
def test_a_regex_digit_is_an_ascii_digit(client, model, extra):
    """\\d is [0-9], as OpenAI, vLLM and outlines take it: the grammar engine's own regexes
    (Rust's) let it write any Unicode digit (U+1FBF9, U+A629, ...), which int() refuses."""
    for prompt in PROMPTS:
        out = client.completions.create(model=model, prompt=prompt, max_tokens=12,
                                        extra_body=extra)  # fmt: skip
        text = out.choices[0].text
        assert re.fullmatch("[0-9]+", text), (prompt, text)
        int(text)


# ---- one decode slot: each request takes the slot the one before it left -----------------------

# longer than any output of the slot's context: the grammar never completes, so a request under
# it is still running when a stop string or a disconnect ends it (the decode log shows which)
ENDLESS_DIGITS = {"type": "object", "required": ["digits"], "additionalProperties": False,
                  "properties": {"digits": {"type": "string", "pattern": "^[0-9]{4000}$"}}}


@pytest.fixture(scope="module")
def one_slot(tokenizer_8000):
    with http_stack(tokenizer_8000, model={"num_slots": 1, "max_seq_len": 1024,
                                           "fake_step_s": 0.002}) as s:  # fmt: skip
        yield s


def digits_request(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "count"}],
            "max_tokens": 900, "response_format": {"type": "json_schema", "json_schema": {
                "name": "digits", "schema": ENDLESS_DIGITS}}, **extra}  # fmt: skip


def released(stack, http_id: str) -> bool:
    """The decode worker freed the request's slot on a message (a stop string's Finish or an
    Abort), not on a token of its own: the case where its next mask was being computed."""
    with open(f"{stack.logs()}/decode-0.log", errors="replace") as fh:
        mark = re.compile(rf" {re.escape(http_id)}\S* released from slot ")  # its core id
        return any(mark.search(line) for line in fh)


def assert_the_slot_serves_the_next_schema(stack) -> None:
    client = stack.openai()
    model = client.models.list().data[0].id
    text, reason = chat_json(client, model, SCHEMAS["person"], "the next one")
    assert reason == "stop", text
    validator(SCHEMAS["person"]).validate(json.loads(text))


def test_a_constrained_request_ended_by_a_stop_string_leaves_its_slot_clean(one_slot):
    model = one_slot.openai().models.list().data[0].id
    for i in range(2):
        rid = f"stopped-{i}"
        with one_slot.http(headers={"X-Request-Id": rid}) as c:
            r = c.post("/v1/chat/completions", json=digits_request(model, stop=['":"']))
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert (choice["finish_reason"], choice["message"]["content"]) == ("stop", '{"digits')
        wait_until(lambda rid=rid: released(one_slot, rid), 30, f"{rid}'s slot to be released")
        assert_the_slot_serves_the_next_schema(one_slot)


def test_a_constrained_request_ended_by_a_disconnect_leaves_its_slot_clean(one_slot):
    model = one_slot.openai().models.list().data[0].id
    for i in range(2):
        rid = f"abandoned-{i}"
        with one_slot.http(headers={"X-Request-Id": rid}) as c:
            with c.stream("POST", "/v1/chat/completions",
                          json=digits_request(model, stream=True)) as r:  # fmt: skip
                assert r.status_code == 200
                text = ""
                for event in sse_events(r.iter_lines()):  # until decode writes the digits
                    text += event["choices"][0]["delta"].get("content") or ""
                    if text.startswith('{"digits":"'):
                        break
                assert text.startswith('{"digits":"'), text
        wait_until(lambda rid=rid: released(one_slot, rid), 30, f"{rid}'s slot to be released")
        assert_the_slot_serves_the_next_schema(one_slot)


def test_a_token_id_past_the_vocabulary_is_the_clients_error(stack):
    """The router checks a grammar against the model's vocabulary as the workers will build it:
    a token id past it is a 400 naming the grammar, not a worker's failure."""
    body = {"prompt": "x", "max_tokens": 8, "guided_grammar": 'start: "hunter2" <[99999]>'}
    with stack.http() as c:
        r = c.post("/v1/completions", json=body)
    err = assert_error_shape(r, 400)
    assert err["code"] == "invalid_grammar"


@pytest.fixture(scope="module")
def slow(tokenizer_8000):
    """Requests that run for minutes (0.05 s a step, 1,000 tokens): one is surely in flight."""
    with http_stack(tokenizer_8000, model={"max_seq_len": 1024, "fake_step_s": 0.05}) as s:
        yield s


def fail_from_a_prefill_worker(stack, rid: str, message: str) -> None:
    """What a prefill worker tells the router of a request it cannot complete, on the router's
    own socket (ipc: the user's own, as the workers' are), once the request is admitted."""
    admitted = re.compile(re.escape(rid) + r"\.[0-9a-f]{8}(?= admitted)")
    found: list[str] = []

    def admitted_yet() -> bool:
        with open(f"{stack.logs()}/router-0.log", errors="replace") as fh:
            found[:] = admitted.findall(fh.read())
        return bool(found)

    wait_until(admitted_yet, 30, f"{rid} admitted")
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.PUSH)
        sock.connect(stack.config.addresses.router)
        sock.send_multipart(protocol.encode(RequestFailed([found[0]], [0], "prefill", message)))
        sock.close(linger=5000)
    finally:
        ctx.term()


def test_a_worker_failure_reaches_the_client_as_an_id_and_the_log_as_its_reason(slow):
    """A worker's failure carries the engine's words and maybe the request's own content (a
    grammar engine quotes the grammar): the client gets neither, in a 500's body or a stream's
    error event, only its request id; the router's log keeps the reason."""
    body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True,
            "guided_grammar": 'start: "hunter2" /[a-z]+/'}  # fmt: skip
    secret = "grammar: parser state ... hunter2 ..."
    for stream in (False, True):
        rid = f"worker-failure-{stream}"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:

            def call(stream=stream, rid=rid):
                with slow.http(headers={"X-Request-Id": rid}, timeout=120) as c:
                    with c.stream("POST", "/v1/completions", json={**body, "stream": stream}) as r:
                        return r, r.read().decode()

            answer = pool.submit(call)
            fail_from_a_prefill_worker(slow, rid, secret)
            r, text = answer.result(timeout=120)
        if stream:
            error = [e for e in sse_events(text.splitlines()) if "error" in e][0]["error"]
        else:
            error = assert_error_shape(r, 500)
        assert error["message"] == f"internal server error: see the server's log for request {rid}"
        assert "hunter2" not in text and "parser state" not in text and "grammar" not in text
        with open(f"{slow.logs()}/router-0.log", errors="replace") as fh:
            records = re.split(r"\n(?=\d{4}-\d\d-\d\d )", fh.read())  # (some span lines)
        logged = [record for record in records if rid in record]
        assert any("parser state" in record for record in logged), logged
