"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) loads and answers a factual question:
proof that dequantization, the Q/K un-permutation and the rotary layout are right end to end
(a wrong rotary layout still runs, but answers nonsense)."""

from __future__ import annotations

import pytest

from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.model.default_model import default_model_path
from splitserve.tokenizers import load_tokenizer

pytestmark = pytest.mark.slow


def test_smollm2_knows_the_capital_of_france():
    path = default_model_path()
    tok = load_tokenizer(path)
    question = {"role": "user", "content": "What is the capital of France?"}
    prompt = tok.apply_chat_template([question])
    ids = tok.encode(prompt)
    engine = build_jax_engine(path, 2, 96, prefill_buckets=(64, 96), decode_buckets=(96,))
    assert (engine.cfg.layers, engine.cfg.heads, engine.cfg.kv_heads) == (30, 9, 3)
    assert engine.cfg.tie_embeddings and engine.vocab_size == 49152
    greedy = SamplingParams()
    prefix = engine.prefill(ids, greedy)
    engine.insert(prefix, 1, greedy)  # slot 1, with slot 0 free: junk there must not matter
    out = [prefix.first_token]
    while len(out) < 24 and out[-1] not in tok.eos_ids:
        out.append(int(engine.generate().tokens[1]))
    answer = tok.decode(out)
    assert "Paris" in answer, answer


def test_smollm2_own_q4_blocks_decode_as_float32():
    """The file's own Q4_1/Q8_0 blocks in the native kernel (prefill and decode) give the greedy
    tokens of float32 weights dequantized from the same file."""
    path = default_model_path()
    tok = load_tokenizer(path)
    questions = ["What is the capital of France?", "Write a haiku about the sea."]

    def answers(fmt):
        engine = build_jax_engine(path, 1, 96, prefill_buckets=(64, 96), decode_buckets=(96,),
                                  weight_format=fmt, prefill_weight_format=fmt)
        out = []
        for q in questions:
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
            prefix = engine.prefill(ids, SamplingParams())
            engine.insert(prefix, 0, SamplingParams())
            out.append([prefix.first_token] + [int(engine.generate().tokens[0]) for _ in range(24)])
            engine.free(0)
        return out

    assert answers("gguf") == answers("float32")
