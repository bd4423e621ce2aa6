"""The Responses API (client.responses.create, streamed and not, text and function tools) and
vLLM's /tokenize and /detokenize, against a real stack with the fake engine."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from splitserve.tokenizers import load_tokenizer
from tests.http_stack import assert_error_shape, http_stack
from tests.pipeline_util import expected_fake_tokens

pytestmark = pytest.mark.timeout(300)

PARAMS = {"type": "object", "additionalProperties": False, "required": ["city"],
          "properties": {"city": {"type": "string", "maxLength": 12}}}  # fmt: skip
TOOLS = [{"type": "function", "name": "get_weather", "description": "forecast",
          "parameters": PARAMS}]  # fmt: skip


@pytest.fixture(scope="module")
def stack(tokenizer_8000):
    with http_stack(tokenizer_8000, model={"max_seq_len": 1024}) as s:
        yield s


@pytest.fixture(scope="module")
def tok(tokenizer_8000):
    return load_tokenizer(tokenizer_8000)


def expected_text(tok, messages, n):
    prompt = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    tokens, reason = expected_fake_tokens(prompt, tok.vocab_size, n, tok.eos_ids)
    return tok.decode(tokens[:-1] if reason == "stop" else tokens), reason, len(prompt)


def test_text_response_is_the_chat_path_s_output(client, model, tok):
    out = client.responses.create(model=model, input="Hello", instructions="Be brief.",
                                  max_output_tokens=12)  # fmt: skip
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    text, reason, prompt_tokens = expected_text(tok, messages, 12)
    assert out.output_text == text and out.object == "response"
    assert out.status == ("incomplete" if reason == "length" else "completed")
    assert out.usage.input_tokens == prompt_tokens
    assert out.output[0].type == "message" and out.output[0].role == "assistant"


def test_streamed_response_events(client, model):
    full = client.responses.create(model=model, input="Stream", max_output_tokens=10)
    events = list(client.responses.create(model=model, input="Stream", max_output_tokens=10,
                                          stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == full.output_text == events[-1].response.output_text


def test_function_tools_required_and_streamed(client, model):
    out = client.responses.create(model=model, input="Weather in Paris?", tools=TOOLS,
                                  tool_choice="required", parallel_tool_calls=False,
                                  max_output_tokens=200)  # fmt: skip
    (call,) = [item for item in out.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), PARAMS)
    events = list(client.responses.create(
        model=model, input="Weather in Paris?", tools=TOOLS, parallel_tool_calls=False,
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=200,
        stream=True,
    ))  # fmt: skip
    kind = "response.function_call_arguments.delta"
    fragments = "".join(e.delta for e in events if e.type == kind)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == fragments
    jsonschema.validate(json.loads(fragments), PARAMS)


def test_a_function_call_and_its_output_go_back_in(client, model):
    out = client.responses.create(model=model, tools=TOOLS, max_output_tokens=8, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ])  # fmt: skip
    assert out.status in ("completed", "incomplete") and out.usage.input_tokens > 50


def test_structured_text_format(client, model):
    schema = {"type": "object", "additionalProperties": False, "required": ["ok"],
              "properties": {"ok": {"type": "boolean"}}}  # fmt: skip
    out = client.responses.create(model=model, input="JSON", max_output_tokens=50, text={
        "format": {"type": "json_schema", "name": "r", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(out.output_text), schema)


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": [{"type": "image", "url": "x"}]}, "input"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x",
                                        "schema": {"type": "intger"}}}}, "text"),
])  # fmt: skip
def test_bad_responses_requests_are_a_400(stack, body, param):
    with stack.http() as c:
        assert_error_shape(c.post("/v1/responses", json=body), 400, param)


def test_tokenize_and_detokenize_as_vllm_serves_them(stack, tok):
    r = httpx.post(f"{stack.url}/tokenize", json={"prompt": "hello world",
                                                  "return_token_strs": True})  # fmt: skip
    body = r.json()
    assert body["tokens"] == tok.encode("hello world") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 1024
    assert "".join(body["token_strs"]) == "hello world"
    messages = [{"role": "user", "content": "hi"}]
    r = httpx.post(f"{stack.url}/tokenize", json={"messages": messages})
    assert r.json()["tokens"] == tok.encode(tok.apply_chat_template(messages),
                                            add_special_tokens=False)  # fmt: skip
    r = httpx.post(f"{stack.url}/detokenize", json={"tokens": body["tokens"]})
    assert r.json() == {"prompt": "hello world"}
    for path, payload, param in [
        ("/tokenize", {"prompt": "a", "messages": messages}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/detokenize", {"tokens": [10**6]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
    ]:
        assert_error_shape(httpx.post(f"{stack.url}{path}", json=payload), 400, param)
