"""A request with a grammar and penalties survives its decode worker's death: the re-prefill of
prompt + tokens so far rebuilds the grammar state by replay (the prefill worker for the next
token, the new decode slot for the rest) and the penalties' counts from the history, so the
stream goes on with exactly the tokens of an undisturbed run, and its JSON is valid."""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import replace

import jsonschema
import pytest

from router.requests import RequestParams
from splitserve.grammar import specs
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import make_config, pipeline, run, wait_for

pytestmark = pytest.mark.slow

STREAMS = 8
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["words"],
          "properties": {"words": {"type": "array", "minItems": 6, "maxItems": 6,
                                   "items": {"type": "string", "maxLength": 16}}}}  # fmt: skip


def test_constrained_and_penalised_streams_survive_the_decode_worker(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, model={"num_slots": STREAMS, "fake_step_s": 0.02},
                         router={"max_running": STREAMS})  # fmt: skip
    grammar = specs.from_json_schema(SCHEMA)
    params = [RequestParams(max_tokens=300, grammar=grammar, frequency_penalty=0.3 * (i % 3),
                            presence_penalty=0.5, logprobs=True, top_logprobs=2)
              for i in range(STREAMS)]  # fmt: skip
    prompts = [tok.encode(f"words for stream {i}") for i in range(STREAMS)]

    async def body():
        async with pipeline(config) as (core, stack):
            undisturbed = []
            for prompt, p in zip(prompts, params, strict=True):
                handle = await core.submit(prompt, p)
                text, result = await handle.finished()
                undisturbed.append((list(handle.token_ids), text, result.finish_reason.api))
            handles = [await core.submit(pr, replace(p, seed=1)) for pr, p in zip(prompts, params,
                                                                                  strict=True)]
            await wait_for(lambda: all(h.completion_tokens >= 3 for h in handles), 60, "streams")
            victim = stack.children[("decode", 0)].popen
            victim.send_signal(signal.SIGSTOP)  # every stream frozen mid-way, then killed
            stack.kill("decode", 0)
            await wait_for(lambda: core.workers.get("decode", 0).state == "dead", 30, "dead")
            stack.restart("decode", 0)
            results = await asyncio.wait_for(asyncio.gather(*(h.finished() for h in handles)), 120)
            for handle, (text, result), (tokens, text0, reason0) in zip(
                handles, results, undisturbed, strict=True
            ):
                assert handle.migrations == 1, handle.request_id
                assert (list(handle.token_ids), text, result.finish_reason.api) == (
                    tokens, text0, reason0)
                assert reason0 == "stop"
                jsonschema.validate(json.loads(text), SCHEMA)

    run(body(), timeout_s=300)
