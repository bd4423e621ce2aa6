"""Tool calling: the tools and the tool messages into the model's own chat template, and the
grammar a required call is constrained to.

The call format is the Hermes one, which Qwen 2.5 / 3, Hermes 2 / 3 and SmolLM3 are trained on:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call. A template that renders tools itself (its source names `tools`) gets them
as Hugging Face's apply_chat_template passes them, with each history call's arguments as an
object (as vLLM does). A template that does not (SmolLM2-Instruct's) would drop them silently;
so for it the tools and the format are written into the system message, each assistant call
into its content as a block, and each tool result into a user turn as a <tool_response> block.
Nothing of the history is dropped either way.
"""

from __future__ import annotations

import json
from typing import Any

from router.http.chat_schemas import ChatMessage, Tool
from splitserve.grammar import specs

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

TOOLS_PROMPT = """You are a function calling AI model. You may call one or more functions to \
assist with the user query. Here are the available functions, within <tools></tools> XML tags:
<tools>
{tools}
</tools>
For each function call, return a JSON object with the function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def template_renders_tools(source: str) -> bool:
    return "tools" in source


def tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    """Tools as Hugging Face templates take them."""
    return [t.model_dump(exclude_none=True) for t in tools]


def template_messages(
    messages: list[ChatMessage], tools: list[Tool] | None, native: bool
) -> list[dict[str, Any]]:
    """The history as the template renders it: native (the template renders tools and tool
    messages) or with the tools written into it (see the module docstring)."""
    out = []
    for m in messages:
        entry: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name is not None:
            entry["name"] = m.name
        if m.reasoning_content is not None:
            entry["reasoning_content"] = m.reasoning_content
        if native:
            if m.tool_calls:
                entry["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {
                        "name": c.function.name, "arguments": json.loads(c.function.arguments),
                    }} for c in m.tool_calls
                ]  # fmt: skip
            if m.tool_call_id is not None:
                entry["tool_call_id"] = m.tool_call_id
        else:
            if m.tool_calls:
                blocks = [call_block(c.function.name, json.loads(c.function.arguments))
                          for c in m.tool_calls]  # fmt: skip
                entry["content"] = "\n".join([entry["content"], *blocks]).lstrip("\n")
            if m.role == "tool":
                entry = {"role": "user",
                         "content": f"<tool_response>\n{m.text()}\n</tool_response>"}  # fmt: skip
        out.append(entry)
    if tools and not native:
        described = "\n".join(json.dumps(t, ensure_ascii=False) for t in tool_dicts(tools))
        prompt = TOOLS_PROMPT.format(tools=described)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def call_block(name: str, arguments: Any) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def call_grammar(tools: list[Tool], only: str | None, parallel: bool) -> specs.GrammarSpec:
    """The grammar of output that is tool calls and nothing else: one call (parallel false) or
    several, of the named function (only) or any; each call's arguments follow its function's
    parameters schema (a function without one takes an object).

    A call is written as json.dumps writes it compactly, {"name":"f","arguments":{...}}, with
    the arguments the root of a schema of their own: a parameters schema nested in a wrapper
    would resolve its references ("#/$defs/Address", what every nested pydantic model gives)
    against the wrapper's root, where they do not exist."""
    chosen = [t for t in tools if only is None or t.function.name == only]
    rules = []
    for i, tool in enumerate(chosen):
        opening = '{"name":' + json.dumps(tool.function.name) + ',"arguments":'
        # no free whitespace, as in structured output
        parameters = {**(tool.function.parameters or {"type": "object"}),
                      "x-guidance": specs.JSON_OPTIONS}  # fmt: skip
        rules.append(f'call_{i}: {json.dumps(opening)} arguments_{i} "}}"')
        rules.append(f"arguments_{i}: %json {json.dumps(parameters)}")
    alternatives = " | ".join(f"call_{i}" for i in range(len(chosen)))
    lark = "\n".join([
        'start: call ("\\n" call)*' if parallel else "start: call",
        f'call: "{CALL_OPEN}\\n" ({alternatives}) "\\n{CALL_CLOSE}"',
        *rules,
    ])  # fmt: skip
    return specs.lark_spec(lark)  # compiled contained (router/http/contained.py)
