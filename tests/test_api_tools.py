"""Tool calling against a real stack (the fake engine) with the openai client, LangChain and
LiteLLM: a required or named call is constrained by the grammar, so its arguments are valid
for the function's schema whatever the fake would write; calls come back as tool_calls with
finish_reason tool_calls, and streamed as OpenAI streams them; the tools and every message of
the history (calls and results) reach the model's prompt through the chat template."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.http_stack import assert_error_shape, http_stack

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 16},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}  # fmt: skip
ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
       "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                      "b": {"type": "integer", "minimum": -99, "maximum": 99}}}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}},
]  # fmt: skip
SCHEMA_OF = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def stack(tokenizer_8000):
    # a request's own template (NATIVE below) needs the operator's leave
    with http_stack(tokenizer_8000, model={"num_slots": 4, "max_seq_len": 2048},
                    router={"trust_request_chat_template": True}) as s:
        yield s


def assert_valid_calls(calls):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA_OF[call.function.name])


def test_a_required_call_is_constrained_and_returned_as_tool_calls(client, model):
    out = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=300,
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1 and not choice.message.content
    assert_valid_calls(choice.message.tool_calls)


def test_a_named_function_is_the_one_called(client, model):
    out = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, max_tokens=300, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )  # fmt: skip
    calls = out.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["add"]
    assert_valid_calls(calls)


def test_streamed_calls_arrive_as_openai_streams_them(client, model):
    args = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=300,
                parallel_tool_calls=False)  # fmt: skip
    whole = client.chat.completions.create(**args).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finishes = []
    fragments = 0
    for chunk in client.chat.completions.create(**args, stream=True):
        for c in chunk.choices:
            if c.finish_reason:
                finishes.append(c.finish_reason)
            for d in c.delta.tool_calls or ():
                if d.id is not None:  # the opening: index, id, type and name, no arguments
                    assert d.index not in calls and d.type == "function"
                    assert d.function.name and d.function.arguments == ""
                    calls[d.index] = {"name": d.function.name, "arguments": "", "id": d.id}
                else:
                    fragments += 1
                    calls[d.index]["arguments"] += d.function.arguments
    assert finishes == ["tool_calls"]
    # (how many pieces depends on how many tokens each text delta carries: the parser's own
    # test checks that a growing call streams in pieces)
    assert fragments >= 1
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole
    ]


def test_parallel_calls_may_be_several(client, model):
    out = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=600,
    )  # fmt: skip
    calls = out.choices[0].message.tool_calls
    # each complete block is a call; one cut off by max_tokens stays text (finish "length")
    assert_valid_calls(calls)
    assert len(calls) >= 1


def rendered(stack, **body) -> str:
    r = httpx.post(f"{stack.url}/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    r = httpx.post(f"{stack.url}/detokenize", json={"tokens": tokens}, timeout=30)
    return r.json()["prompt"]


HISTORY = [
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]  # fmt: skip


def test_tools_and_the_whole_history_reach_a_template_that_renders_no_tools(stack):
    text = rendered(stack, messages=HISTORY, tools=TOOLS)
    assert '"name": "get_weather"' in text and '"description": "a + b"' in text  # the tools
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text  # the result


NATIVE = (
    "{% for t in tools %}[tool {{ t.function.name }}]{% endfor %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}(call {{ c.function.name }} {{ c.function.arguments.city }}"
    " {{ c.id }}){% endfor %}{% if m.tool_call_id %}(result of {{ m.tool_call_id }}){% endif %}"
    "{% endfor %}"
)


def test_a_template_that_renders_tools_gets_them_as_hugging_face_passes_them(stack):
    text = rendered(stack, messages=HISTORY, tools=TOOLS, chat_template=NATIVE)
    assert text.startswith("[tool get_weather][tool add]")
    assert "(call get_weather Paris call_1)" in text  # arguments as an object, as vLLM does
    assert "<tool>sunny, 21 C(result of call_1)" in text


def test_the_history_is_served_end_to_end(client, model):
    out = client.chat.completions.create(model=model, messages=HISTORY, tools=TOOLS,
                                         max_tokens=20)  # fmt: skip
    assert out.choices[0].finish_reason in ("stop", "length")


def test_tool_choice_none_renders_no_tools(stack):
    assert "get_weather" not in rendered(stack, messages=ASK, tools=TOOLS, tool_choice="none")


@pytest.mark.parametrize("body, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "intger"}}}], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "f", "arguments": "{not json"}}]}]}, "messages"),
    ({"functions": [{"name": "f"}]}, "functions"),
])  # fmt: skip
def test_bad_tool_requests_are_a_400_naming_the_field(stack, body, param):
    payload = {"messages": ASK, **body}
    with stack.http() as c:
        assert_error_shape(c.post("/v1/chat/completions", json=payload), 400, param)


def test_langchain_bind_tools_agent_loop(stack, model):
    """The loop every agent framework runs: the model asks for a tool, the tool runs, its
    result goes back in the history, the model answers."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    calls = []

    class AddArgs(BaseModel):  # bounded: the fake engine would write digits without end
        a: int = Field(ge=-99, le=99)
        b: int = Field(ge=-99, le=99)

    @tool(args_schema=AddArgs)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    llm = ChatOpenAI(model=model, base_url=f"{stack.url}/v1", api_key="x", max_tokens=200,
                     max_retries=0, timeout=30)  # fmt: skip
    messages = [HumanMessage("What is 2 + 3?")]
    # strict: no other properties (the fake engine would write them without end)
    bound = llm.bind_tools([add], tool_choice="any", parallel_tool_calls=False, strict=True)
    ai = bound.invoke(messages)
    assert ai.tool_calls and ai.response_metadata["finish_reason"] == "tool_calls"
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"]))
    final = llm.bind_tools([add]).invoke(messages)  # auto: the fake answers in text
    assert calls and isinstance(final.content, str) and not final.tool_calls
    assert final.response_metadata["finish_reason"] in ("stop", "length")
    # the call and its result were in the last prompt
    assert final.usage_metadata["input_tokens"] > ai.usage_metadata["input_tokens"]


def test_litellm_tools(stack, model):
    import litellm

    out = litellm.completion(
        model=f"openai/{model}", api_base=f"{stack.url}/v1", api_key="x", messages=ASK,
        tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=300,
        timeout=30,
    )  # fmt: skip
    assert out.choices[0].finish_reason == "tool_calls"
    assert_valid_calls(out.choices[0].message.tool_calls)


def test_a_nested_pydantic_model_is_a_tool_and_its_forced_call_validates(client, model):
    """pydantic_function_tool of a model with a nested one: the parameters refer to
    "#/$defs/Address", which must resolve against the parameters' own root."""
    from openai import pydantic_function_tool
    from pydantic import BaseModel, Field

    class Address(BaseModel):  # bounded: the fake engine would write a string without end
        street: str = Field(max_length=12)
        city: str = Field(max_length=12)

    class Person(BaseModel):
        name: str = Field(max_length=12)
        home: Address
        work: Address | None

    tool = pydantic_function_tool(Person)
    assert "$defs" in tool["function"]["parameters"]
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Who lives where?"}], tools=[tool],
        tool_choice={"type": "function", "function": {"name": "Person"}}, max_tokens=400,
        parallel_tool_calls=False,
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    assert isinstance(Person.model_validate(arguments).home, Address)
