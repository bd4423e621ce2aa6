"""The real JAX engine (a tiny random Llama) with its prefix cache in the pipeline: prompts sharing
a beginning, served one after another, reuse it (cached_tokens says so) and still produce exactly
the tokens of the engine driven directly from scratch."""

from __future__ import annotations

import numpy as np
import pytest

from router.requests import RequestParams
from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from tests.pipeline_util import make_config, pipeline, programs_compiled, run

pytestmark = pytest.mark.slow

MODEL = "random:test-tiny"
MAX_SEQ_LEN = 128
BUCKETS = [32, 128]  # few programs to compile
BLOCK = 16
TOKENS = 12


def direct(engine, prompt):
    prefix = engine.prefill(prompt, SamplingParams())
    engine.insert(prefix, 0, SamplingParams())
    tokens = [prefix.first_token]
    for _ in range(TOKENS - 1):
        tokens.append(int(engine.generate().tokens[0]))
    engine.free(0)
    return tokens


def test_reused_prefixes_serve_the_tokens_of_a_scratch_run(tokenizer_512):
    rng = np.random.default_rng(4)
    shared = rng.integers(3, 500, 50).tolist()
    prompts = [shared + rng.integers(3, 500, n).tolist() for n in (1, 14, 30, 47)]
    prompts += [shared[:BLOCK * 2 + 1], shared[:BLOCK * 2] + [7]]  # at block boundaries
    engine = build_jax_engine(MODEL, 1, MAX_SEQ_LEN, prefill_buckets=BUCKETS)
    engine.warmup()
    expected = [direct(engine, p) for p in prompts]
    config = make_config(
        tokenizer_512,
        "processes",
        model={"engine": "jax", "path": MODEL, "num_slots": 2, "max_seq_len": MAX_SEQ_LEN,
               "prefill_buckets": BUCKETS, "prefix_block_tokens": BLOCK},
        lifecycle={"liveness_timeout_s": 5.0},
    )  # fmt: skip

    async def body():
        async with pipeline(config, ready_s=300) as (core, _):
            # the continuation programs compile after Ready, in the background: until then a
            # prompt is prefilled whole (the same tokens, nothing reused)
            await programs_compiled(core, 300)  # the prefill worker's load says so
            params = RequestParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
            for rounds in range(2):
                for i, (p, want) in enumerate(zip(prompts, expected, strict=True)):
                    handle = await core.submit(p, params)
                    ids, cached = [], 0
                    async for d in handle:
                        ids.extend(d.token_ids)
                        cached = cached or d.cached_tokens
                    assert ids == want, (rounds, i)
                    if rounds or i:  # everything after the very first prompt shares a block
                        assert cached >= BLOCK * 2, (rounds, i, cached)
                    else:
                        assert cached == 0

    run(body(), timeout_s=500)
