"""A grammar mask in the JAX engine's compiled step (random tiny Llama, llguidance over the
512-token test vocabulary), driven as the decode worker drives it: the masks of the constrained
slots come from SlotGrammars (computed on its thread, a Future the engine waits for after the
model pass is dispatched). Greedy output of random weights is valid JSON for the schema, next to
an unconstrained request that still gets its plain tokens."""

from __future__ import annotations

import json

import jsonschema
import pytest

from splitserve.engine.interface import LogitsControls, SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.grammar import specs
from splitserve.grammar.masks import SlotGrammars
from splitserve.grammar.matcher import GrammarState
from splitserve.grammar.vocabulary import grammar_tokenizer
from splitserve.tokenizers import load_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green", "blue"]},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["ok", "colour", "tags"],
    "additionalProperties": False,
}  # fmt: skip
MAX_TOKENS = 60


@pytest.fixture(scope="module")
def tok(tokenizer_512):
    return load_tokenizer(tokenizer_512)


def test_greedy_output_under_a_schema_mask_is_valid_json(tok):
    engine = build_jax_engine("random:test-tiny:3", 4, 128, prefill_buckets=(16, 128),
                              decode_buckets=(128,))  # fmt: skip
    vocab = grammar_tokenizer(tok, engine.vocab_size)
    grammar = specs.from_json_schema(SCHEMA)
    ends = sorted(tok.eos_ids)
    grammars = SlotGrammars(engine.vocab_size)
    greedy = SamplingParams()
    plain_prompt = tok.encode("plain text next to it")
    plain_alone = engine.prefill(plain_prompt, greedy)
    engine.insert(plain_alone, 0, greedy)
    want_plain = [plain_alone.first_token] + [int(engine.generate().tokens[0]) for _ in range(8)]
    engine.free(0)

    live: dict[int, list[int]] = {}  # constrained slot -> its output so far
    for slot, text in ((1, "give me json"), (3, "another one")):
        state = GrammarState(vocab, grammar, ends)
        prefix = engine.prefill(tok.encode(text), greedy, mask=state.mask())
        state.replay([prefix.first_token])
        engine.insert(prefix, slot, greedy, controls=LogitsControls())
        grammars.add(slot, state)
        live[slot] = [prefix.first_token]
    prefix = engine.prefill(plain_prompt, greedy)
    engine.insert(prefix, 0, greedy)
    plain = [prefix.first_token]
    done: dict[int, list[int]] = {}
    try:
        grammars.prepare()
        for _ in range(MAX_TOKENS):
            masks, errors = grammars.masks()
            assert not errors
            out = engine.generate(masks=masks)
            assert not grammars.advance(out.tokens.tolist())
            plain.append(int(out.tokens[0]))
            for slot in list(live):
                token = int(out.tokens[slot])
                if token in tok.eos_ids:  # the grammar allowed an end: it is complete
                    grammars.remove(slot)
                    engine.free(slot)
                    done[slot] = live.pop(slot)
                else:
                    live[slot].append(token)
            if not live:
                break
            grammars.prepare()
    finally:
        grammars.close()
    assert not live, "a constrained request did not end within MAX_TOKENS"
    assert sorted(done) == [1, 3]
    for tokens in done.values():
        jsonschema.validate(json.loads(tok.decode(tokens)), SCHEMA)
    assert plain[:9] == want_plain  # the plain request sharing the batch is unaffected
