"""Nothing silently ignored: every field of the openai package's own request types (chat,
completions, responses) and of vLLM's extras is either honoured (the request succeeds, and the
tests of each feature check what it does) or refused with a 400 that names it. The tables
below must cover every field the installed openai package defines: a field it adds later
fails this test until it is classified."""

from __future__ import annotations

import typing

import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as responses_params

from tests.http_stack import assert_error_shape, http_stack

pytestmark = pytest.mark.timeout(300)

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
MESSAGES = [{"role": "user", "content": "hi"}]


def openai_fields(module) -> set[str]:
    names: set[str] = set()
    for cls in ("CompletionCreateParamsStreaming", "CompletionCreateParamsNonStreaming",
                "ResponseCreateParamsStreaming", "ResponseCreateParamsNonStreaming"):
        if hasattr(module, cls):
            names |= set(typing.get_type_hints(getattr(module, cls), include_extras=False))
    return names


# field -> (extra fields it needs, value): honoured
CHAT_HONOURED = {
    "messages": ({}, MESSAGES), "model": ({}, None), "frequency_penalty": ({}, 0.5),
    "presence_penalty": ({}, -0.5), "logit_bias": ({}, {"5": 2.0}), "logprobs": ({}, True),
    "top_logprobs": ({"logprobs": True}, 3), "max_completion_tokens": ({}, 2),
    "max_tokens": ({}, 2), "n": ({}, 2), "seed": ({}, 7), "stop": ({}, ["zz"]),
    "stream": ({}, True), "stream_options": ({"stream": True}, {"include_usage": True}),
    "temperature": ({}, 0.3), "top_p": ({}, 0.8), "user": ({}, "u-1"),
    "safety_identifier": ({}, "s-1"), "response_format": ({}, {"type": "json_object"}),
    "tools": ({}, [TOOL]), "tool_choice": ({"tools": [TOOL]}, "none"),
    "parallel_tool_calls": ({"tools": [TOOL]}, False), "store": ({}, False),
    "service_tier": ({}, "auto"), "modalities": ({}, ["text"]), "metadata": ({}, {}),
}  # fmt: skip
CHAT_REFUSED = {
    "audio": {"voice": "alloy", "format": "mp3"}, "function_call": "auto",
    "functions": [{"name": "f"}], "moderation": {"model": "x"}, "prediction": {
        "type": "content", "content": "x"}, "prompt_cache_key": "k",
    "prompt_cache_options": {"mode": "x"}, "prompt_cache_retention": "24h",
    "reasoning_effort": "low", "verbosity": "low", "web_search_options": {},
}  # fmt: skip
COMPLETION_HONOURED = {
    "prompt": ({}, "hi"), "model": ({}, None), "best_of": ({"n": 2}, 2), "echo": ({}, True),
    "frequency_penalty": ({}, 0.5), "presence_penalty": ({}, 0.5), "logit_bias": ({}, {"5": 1}),
    "logprobs": ({}, 2), "max_tokens": ({}, 2), "n": ({}, 2), "seed": ({}, 1),
    "stop": ({}, "zz"), "stream": ({}, True), "stream_options": ({"stream": True}, {
        "include_usage": True}), "temperature": ({}, 0.5), "top_p": ({}, 0.5),
    "user": ({}, "u"),
}  # fmt: skip
COMPLETION_REFUSED = {"suffix": "and the end"}
RESPONSES_HONOURED = {
    "input": ({}, "hi"), "model": ({}, None), "instructions": ({}, "Be brief."),
    "include": ({}, ["message.output_text.logprobs"]), "max_output_tokens": ({}, 2),
    "parallel_tool_calls": ({"tools": [{"type": "function", "name": "f"}]}, False),
    "safety_identifier": ({}, "s"), "stream": ({}, True), "stream_options": ({"stream": True}, {
        "include_obfuscation": False}), "temperature": ({}, 0.5), "top_p": ({}, 0.5),
    "top_logprobs": ({}, 2), "text": ({}, {"format": {"type": "text"}}),
    "tool_choice": ({"tools": [{"type": "function", "name": "f"}]}, "none"),
    "tools": ({}, [{"type": "function", "name": "f", "parameters": {"type": "object"}}]),
    "user": ({}, "u"), "store": ({}, False), "truncation": ({}, "disabled"),
    "service_tier": ({}, "default"),
}  # fmt: skip
RESPONSES_REFUSED = {
    "access_programs": ["x"], "background": True, "background_options": {"x": 1},
    "context_management": [{"type": "compaction"}], "conversation": "conv_1", "image": {},
    "max_tool_calls": 2, "metadata": {"a": "b"}, "moderation": {"x": 1},
    "previous_response_id": "resp_1", "prompt": {"id": "p"}, "prompt_cache_key": "k",
    "prompt_cache_options": {}, "prompt_cache_retention": "24h", "reasoning": {"effort": "low"},
}  # fmt: skip
# vLLM's extra request fields (vllm/entrypoints/openai/protocol.py), as they are written there
VLLM_HONOURED = {
    "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2, "stop_token_ids": [3],
    "include_stop_str_in_output": True, "ignore_eos": True, "min_tokens": 1,
    "skip_special_tokens": False, "prompt_logprobs": 1, "bad_words": ["bad"],
    "structured_outputs": {"choice": ["a", "b"]}, "guided_json": {"type": "object"},
    "guided_regex": "[ab]", "guided_choice": ["a", "b"], "guided_grammar": 'start: "a"',
    "guided_decoding_backend": "guidance", "spaces_between_special_tokens": True,
    "length_penalty": 1.0, "use_beam_search": False,
}  # fmt: skip
VLLM_CHAT_HONOURED = {
    "add_generation_prompt": False, "add_special_tokens": True,
    "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
    "chat_template_kwargs": {"enable_thinking": False}, "echo": False,
}  # fmt: skip
VLLM_REFUSED = {
    "use_beam_search": True, "length_penalty": 0.5, "truncate_prompt_tokens": 10,
    "allowed_token_ids": [1, 2], "spaces_between_special_tokens": False,
    "logits_processors": ["x"], "priority": 1, "cache_salt": "s",
    "kv_transfer_params": {"x": 1}, "vllm_xargs": {"x": 1}, "return_tokens_as_token_ids": True,
    "return_token_ids": True, "request_id": "r", "guided_decoding_backend": "outlines",
    "guided_whitespace_pattern": " ", "mm_processor_kwargs": {}, "structural_tag": "x",
    "prompt_embeds": "AAAA",
}  # fmt: skip
VLLM_CHAT_REFUSED = {"documents": [{"text": "x"}], "echo": True, "media_io_kwargs": {}}


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    # chat_template is honoured where the operator allows it (refused otherwise:
    # tests/test_http_contained.py)
    with http_stack(tokenizer_512, router={"max_running": 16,
                                           "trust_request_chat_template": True}) as s:
        yield s


def test_the_tables_cover_every_field_of_the_openai_request_types():
    assert openai_fields(chat_params) == set(CHAT_HONOURED) | set(CHAT_REFUSED)
    assert openai_fields(completion_params) == set(COMPLETION_HONOURED) | set(COMPLETION_REFUSED)
    assert openai_fields(responses_params) == set(RESPONSES_HONOURED) | set(RESPONSES_REFUSED)


def post(stack, path, body):
    with stack.http() as c:
        return c.post(path, json=body)


BASES = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
}


def honoured(path, table):
    return [pytest.param(path, name, needs, value, id=f"{path}:{name}")
            for name, (needs, value) in table.items()]  # fmt: skip


def refused(path, table):
    return [pytest.param(path, name, value, id=f"{path}:{name}") for name, value in table.items()]


@pytest.mark.parametrize("path, name, needs, value", [
    *honoured("/v1/chat/completions", CHAT_HONOURED),
    *honoured("/v1/completions", COMPLETION_HONOURED),
    *honoured("/v1/responses", RESPONSES_HONOURED),
    *honoured("/v1/chat/completions", {k: ({}, v) for k, v in VLLM_HONOURED.items()}),
    *honoured("/v1/chat/completions", {k: ({}, v) for k, v in VLLM_CHAT_HONOURED.items()}),
    *honoured("/v1/completions", {k: ({}, v) for k, v in VLLM_HONOURED.items()}),
])  # fmt: skip
def test_an_honoured_field_is_taken(stack, path, name, needs, value):
    body = {**BASES[path], **needs}
    if value is not None:
        body[name] = value
    elif name == "model":
        body[name] = stack.openai().models.list().data[0].id
    r = post(stack, path, body)
    assert r.status_code == 200, (name, r.text)


@pytest.mark.parametrize("path, name, value", [
    *refused("/v1/chat/completions", CHAT_REFUSED),
    *refused("/v1/completions", COMPLETION_REFUSED),
    *refused("/v1/responses", RESPONSES_REFUSED),
    *refused("/v1/chat/completions", VLLM_REFUSED),
    *refused("/v1/chat/completions", VLLM_CHAT_REFUSED),
    *refused("/v1/completions", VLLM_REFUSED),
    *refused("/v1/completions", {"no_such_field": 1, "documents": [{"text": "x"}]}),
    *refused("/v1/responses", {"no_such_field": 1, "store": True, "truncation": "auto",
                                "service_tier": "flex"}),
    *refused("/v1/chat/completions", {"store": True, "service_tier": "priority",
                                      "metadata": {"a": "b"}, "modalities": ["text", "audio"],
                                      "n_of_everything": 3}),
])  # fmt: skip
def test_a_refused_field_is_a_400_naming_it(stack, path, name, value):
    r = post(stack, path, {**BASES[path], name: value})
    error = assert_error_shape(r, 400, name)
    assert name in error["message"]
