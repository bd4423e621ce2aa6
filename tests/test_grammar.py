"""The grammar engine's parts: grammars from the API's forms (refused clearly when invalid),
a matcher's replay (how a moved request rebuilds its state), the end tokens of a completed
grammar, and the decode worker's masks computed on their own thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from splitserve.engine.interface import unpack_mask
from splitserve.grammar import specs
from splitserve.grammar.masks import SlotGrammars
from splitserve.grammar.matcher import GrammarError, GrammarState
from splitserve.grammar.vocabulary import grammar_tokenizer
from splitserve.tokenizers import load_tokenizer

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def tok(tokenizer_512):
    return load_tokenizer(tokenizer_512)


@pytest.fixture(scope="module")
def vocab(tok):
    return grammar_tokenizer(tok, tok.vocab_size)


@pytest.mark.parametrize("build, value, words", [
    (specs.from_json_schema, {"type": "intger"}, "intger"),
    (specs.from_json_schema, {"type": "string", "format": "no-such-format"}, "format"),
    (specs.from_json_schema, "not a schema", "object"),
    (specs.from_regex, "[a-", "regex"),
    (specs.from_choice, [], "non-empty"),
    (specs.from_lark, "start: undefined_rule", "undefined_rule"),
])  # fmt: skip
def test_an_invalid_grammar_is_refused_with_the_engine_reason(build, value, words):
    with pytest.raises(GrammarError, match=words):
        build(value)


def test_a_gbnf_grammar_is_taken_too():
    assert specs.from_lark('root ::= "yes" | "no"')


def walk(tok, state: GrammarState, text: str) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False)
    for t in ids:
        assert unpack_mask(state.mask(), tok.vocab_size)[t], (text, t)
        state.advance(t)
    return ids


def test_a_matcher_replayed_over_the_output_so_far_allows_what_the_original_allows(tok, vocab):
    grammar = specs.from_json_schema(SCHEMA)
    first = GrammarState(vocab, grammar, tok.eos_ids)
    ids = walk(tok, first, '{"n":12')
    replayed = GrammarState(vocab, grammar, tok.eos_ids)
    replayed.replay(ids)
    assert np.array_equal(first.mask(), replayed.mask())


def test_a_completed_grammar_allows_only_the_end_tokens(tok, vocab):
    state = GrammarState(vocab, specs.from_json_schema(SCHEMA), tok.eos_ids)
    walk(tok, state, '{"n":1}')
    allowed = set(np.flatnonzero(unpack_mask(state.mask(), tok.vocab_size)).tolist())
    assert allowed == set(tok.eos_ids)


def test_output_that_breaks_the_grammar_is_an_error(tok, vocab):
    state = GrammarState(vocab, specs.from_json_schema(SCHEMA), tok.eos_ids)
    with pytest.raises(GrammarError):
        state.replay(tok.encode("not json", add_special_tokens=False))


def test_masks_are_computed_on_their_own_thread_and_follow_the_slots(tok, vocab):
    grammar = specs.from_choice(["alpha", "beta"])
    slots = SlotGrammars(tok.vocab_size)
    try:
        slots.add(3, GrammarState(vocab, grammar, tok.eos_ids))
        masks, errors = slots.masks()
        assert errors == {} and masks.slots.tolist() == [3]
        row = masks.wait()[0]
        first = {int(t) for t in np.flatnonzero(unpack_mask(row, tok.vocab_size))}
        assert first and all(
            tok.decode([t]) and ("alpha".startswith(tok.decode([t])) or "beta".startswith(
                tok.decode([t]))) for t in first
        )  # fmt: skip
        token = min(first)
        tokens = [0] * 8
        tokens[3] = token
        assert slots.advance(tokens) == {}
        seen = []
        original = slots.states[3].fill

        def fill(row):  # records which thread computes the mask
            seen.append(threading.current_thread().name)
            original(row)

        slots.states[3].fill = fill
        slots.prepare()
        masks, _ = slots.masks()
        masks.wait()
        assert seen and seen[0].startswith("grammar-masks")
        slots.add(5, GrammarState(vocab, grammar, tok.eos_ids))  # added after prepare()
        masks, _ = slots.masks()
        assert masks.slots.tolist() == [3, 5] and masks.wait().shape[0] == 2
        slots.remove(3)
        masks, _ = slots.masks()
        assert masks.slots.tolist() == [5]
    finally:
        slots.close()


def test_the_json_schema_grammar_writes_no_free_whitespace(tok, vocab):
    state = GrammarState(vocab, specs.from_json_schema(SCHEMA), tok.eos_ids)
    walk(tok, state, "{")
    allowed = np.flatnonzero(unpack_mask(state.mask(), tok.vocab_size))
    assert not any(tok.decode([int(t)]).isspace() for t in allowed)


@pytest.mark.parametrize("pattern, allowed, refused", [
    (r"\d+", "0123456789", ["٣", "३", "５"]),  # Arabic-Indic, Devanagari, fullwidth digits
    (r"\w+", "az_AZ09", ["é", "ß", "٣"]),
    (r"[\d]+", "42", ["٣"]),
    (r"\D", "x", ["3"]),
    (r"\s", " ", ["x"]),
])  # fmt: skip
def test_a_regex_class_means_what_it_means_in_a_json_schema_pattern(tok, vocab, pattern, allowed,
                                                                   refused):
    """\\d is [0-9] and \\w [0-9a-zA-Z_] (ECMA-262, as OpenAI, vLLM and outlines take them), not
    any Unicode digit or letter: a client asking for \\d+ reads the output with int()."""
    grammar = specs.from_regex(pattern)

    def takes(text):
        state = GrammarState(vocab, grammar, tok.eos_ids)
        return state.matcher.consume_tokens(tok.encode(text, add_special_tokens=False))

    assert takes(allowed)
    for text in refused:
        assert not takes(text), (pattern, text)


def test_a_mask_computed_for_a_freed_request_is_never_given_to_the_next_in_its_slot(tok, vocab):
    """A stop string or an abort frees a slot while the thread computes its next mask; the
    next request in that slot gets a mask of its own grammar."""
    digits = specs.from_regex("[0-9]{50}")
    words = specs.from_choice(["alpha", "beta"])
    slots = SlotGrammars(tok.vocab_size)
    try:
        for also_live in ([], [5]):  # the set of slots the same as prepared, or not
            for slot in also_live:
                slots.add(slot, GrammarState(vocab, words, tok.eos_ids))
            slots.add(0, GrammarState(vocab, digits, tok.eos_ids))
            slots.prepare()  # the freed request's mask, on the thread
            slots.remove(0)
            nxt = GrammarState(vocab, words, tok.eos_ids)
            slots.add(0, nxt)
            masks, errors = slots.masks()
            assert not errors and masks.slots.tolist() == [0, *also_live]
            assert np.array_equal(masks.wait()[0], nxt.mask())
            for slot in [0, *also_live]:
                slots.remove(slot)
    finally:
        slots.close()
