"""LangChain's bind_tools agent loop against the default model (SmolLM2-135M-Instruct, the JAX
engine in worker processes): with tool_choice "any" (the API's "required") the grammar makes the
model's output a valid call of the tool, the tool runs, its result goes back in the history, and
the model answers in text. Nothing here depends on timing: the waits are generous bounds."""

from __future__ import annotations

import pytest

from splitserve.engine.model.default_model import default_model_path
from tests.http_stack import http_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

CLIENT_TIMEOUT_S = 600.0  # one request on a loaded 2-core host, the model compiled already


@pytest.fixture(scope="module")
def stack():
    path = default_model_path()
    model = {"engine": "jax", "path": "default", "num_slots": 2, "max_seq_len": 1024}
    # the warm-up compiles every prefill and decode program of a 30-layer model
    with http_stack(path, model=model, lifecycle={"liveness_timeout_s": 10.0},
                    ready_s=1500.0) as s:  # fmt: skip
        yield s


def test_bind_tools_agent_loop_with_the_default_model(stack):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    model = stack.openai().models.list().data[0].id
    calls = []

    class AddArgs(BaseModel):
        a: int = Field(ge=0, le=999)
        b: int = Field(ge=0, le=999)

    @tool(args_schema=AddArgs)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    llm = ChatOpenAI(model=model, base_url=f"{stack.url}/v1", api_key="x", max_tokens=120,
                     temperature=0, max_retries=0, timeout=CLIENT_TIMEOUT_S)  # fmt: skip
    messages = [HumanMessage("What is 2 + 3? Use the add tool.")]
    bound = llm.bind_tools([add], tool_choice="any", parallel_tool_calls=False, strict=True)
    ai = bound.invoke(messages)
    assert ai.response_metadata["finish_reason"] == "tool_calls", ai
    assert len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "add", ai.tool_calls
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"]))
    assert len(calls) == 1 and all(0 <= x <= 999 for x in calls[0])  # the schema held
    final = llm.bind_tools([add], tool_choice="none").invoke(messages)
    assert isinstance(final.content, str) and final.content.strip(), final
    assert not final.tool_calls
    assert final.response_metadata["finish_reason"] in ("stop", "length")
    # the call and its result were in the second prompt: longer than the question alone, sent
    # the same way (tool_choice "none" renders no tools)
    one = ChatOpenAI(model=model, base_url=f"{stack.url}/v1", api_key="x", max_tokens=1,
                     temperature=0, max_retries=0, timeout=CLIENT_TIMEOUT_S)  # fmt: skip
    question = one.bind_tools([add], tool_choice="none").invoke(messages[:1])
    assert final.usage_metadata["input_tokens"] > question.usage_metadata["input_tokens"] + 10
    print("tool call:", ai.tool_calls[0]["args"], "answer:", repr(final.content))
