"""The real JAX engine (a tiny random Llama) runs unchanged in the pipeline, in both modes: the
served token ids equal what the engine itself produces when driven directly, greedy and seeded."""

from __future__ import annotations

import pytest

from router.requests import RequestParams
from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import make_config, pipeline, run

pytestmark = pytest.mark.slow

MODEL = "random:test-tiny"
SLOTS = 4
MAX_SEQ_LEN = 128


def _direct(engine, prompt, sampling, n):
    prefix = engine.prefill(prompt, sampling)
    engine.insert(prefix, 0, sampling)
    tokens = [prefix.first_token]
    for _ in range(n - 1):
        tokens.append(int(engine.generate().tokens[0]))
    engine.free(0)
    return tokens


@pytest.fixture(scope="module")
def direct_engine():
    engine = build_jax_engine(MODEL, SLOTS, MAX_SEQ_LEN)
    engine.warmup()
    return engine


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_jax_engine_serves_same_tokens_as_direct_run(tokenizer_512, direct_engine, mode):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512,
        mode,
        model={"engine": "jax", "path": MODEL, "num_slots": SLOTS, "max_seq_len": MAX_SEQ_LEN},
        lifecycle={"liveness_timeout_s": 5.0},
    )
    prompts = [tok.encode(t) for t in ("hello world", "東京 🙂 data", "the order of tokens", "a")]
    cases = [
        (p, SamplingParams(), RequestParams(max_tokens=24, temperature=0.0, ignore_eos=True))
        for p in prompts
    ] + [
        (
            p,
            SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=1234 + i),
            RequestParams(
                max_tokens=24, temperature=0.8, top_p=0.9, top_k=50, seed=1234 + i, ignore_eos=True
            ),
        )
        for i, p in enumerate(prompts)
    ]
    expected = [_direct(direct_engine, p, s, 24) for p, s, _ in cases]

    async def body():
        async with pipeline(config, ready_s=480) as (core, _):
            # all at once: the served batch mixes them, which must not change any output
            handles = [await core.submit(p, params) for p, _, params in cases]
            got = []
            for h in handles:
                ids = []
                async for d in h:
                    ids.extend(d.token_ids)
                got.append((ids, h.result))
            for (ids, result), want in zip(got, expected, strict=True):
                assert result.finish_reason.api == "length"
                assert ids == want

    run(body(), timeout_s=800)  # under the suite timeout (900 s): the warm-up compiles the
    # batched prefill and 4-step decode programs too, minutes on a busy 2-core host
