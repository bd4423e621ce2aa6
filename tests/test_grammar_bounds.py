"""The bounds on a client's grammar (splitserve/grammar/bounds.py), checked before anything
compiles it: the shapes that overflow the grammar engine's stack (3,000
chained Lark rules, a 3,000-long $ref chain) are refused naming the bound, in linear time, and
real schemas (the structured-output corpus, recursive ones included) pass. Size and rules are
checked when the spec is made (the router's loop), nesting and $ref chains by compile_spec
(the contained child), before the compiler runs."""

from __future__ import annotations

import json

import pytest

from splitserve.grammar import bounds, specs
from splitserve.grammar.bounds import GrammarTooComplex
from tests.hostile_grammars import lark_chain, ref_chain
from tests.schema_corpus import SCHEMAS


def test_three_thousand_chained_rules_are_refused_by_their_count():
    text = lark_chain(3000)
    assert len(text) > 40_000
    with pytest.raises(GrammarTooComplex, match="3002 rules"):
        specs.lark_spec(text)


def test_a_gbnf_grammar_s_rules_count_too():
    rules = [f'r{i} ::= "a" r{i + 1}' for i in range(600)]
    with pytest.raises(GrammarTooComplex, match="rules"):
        specs.lark_spec("\n".join(["root ::= r0", *rules, 'r600 ::= "z"']))


def compiled(schema) -> str:
    return specs.compile_spec(specs.json_spec(schema))


def test_a_three_thousand_long_ref_chain_is_refused_naming_its_length():
    schema = ref_chain(3000)
    assert len(json.dumps(schema)) > 100_000
    with pytest.raises(GrammarTooComplex, match="chain of 3001 \\$ref links"):
        compiled(schema)


def test_a_ref_chain_at_the_bound_passes_and_one_past_it_does_not():
    assert bounds.ref_chain(ref_chain(bounds.MAX_REF_CHAIN - 1), 10**9) == bounds.MAX_REF_CHAIN
    assert compiled(ref_chain(bounds.MAX_REF_CHAIN - 1))
    with pytest.raises(GrammarTooComplex):
        compiled(ref_chain(bounds.MAX_REF_CHAIN))


def test_a_recursive_schema_counts_its_cycle_once():
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
        "parent": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"}  # fmt: skip
    assert bounds.ref_chain(tree, 10**6) == 1
    mutual = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
              "$ref": "#/$defs/a"}  # fmt: skip
    assert bounds.ref_chain(mutual, 10**6) == 2


def test_a_ref_chain_through_pointers_into_properties_is_followed():
    props = {f"p{i}": {"$ref": f"#/properties/p{i + 1}"} for i in range(300)}
    props["p300"] = {"type": "integer"}
    with pytest.raises(GrammarTooComplex, match="\\$ref links"):
        compiled({"type": "object", "properties": props})


def test_targets_that_overlap_past_the_scan_budget_are_refused():
    # sixty nested levels over a large leaf, a $ref to each level: scanning every target would
    # read the leaf sixty times
    node: dict = {"properties": {f"k{i}": {"type": "integer"} for i in range(2000)}}
    for _ in range(60):
        node = {"type": "object", "properties": {"a": node}}
    pointers = ["#" + "/properties/a" * k for k in range(60)]
    schema = {"$defs": {"tree": node}, "anyOf": [
        {"$ref": p.replace("#", "#/$defs/tree", 1)} for p in pointers]}  # fmt: skip
    with pytest.raises(GrammarTooComplex, match="overlap"):
        compiled(schema)


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_nesting_past_the_bound_is_refused():
    with pytest.raises(GrammarTooComplex, match="nests deeper than 128"):
        compiled(nested(200))
    with pytest.raises(GrammarTooComplex, match="nests deeper than 128"):
        specs.json_spec(nested(2000))  # deeper than json itself writes: refused at once


def test_a_schema_embedded_in_a_lark_grammar_is_bounded_too():
    grammar = f"start: %json {json.dumps(ref_chain(500))}"
    with pytest.raises(GrammarTooComplex, match="%json schema #1"):
        specs.compile_spec(specs.lark_spec(grammar))


def test_sources_past_the_size_bound_are_refused():
    with pytest.raises(GrammarTooComplex, match="characters"):
        specs.regex_spec("a" * (bounds.MAX_SOURCE_CHARS + 1))
    with pytest.raises(GrammarTooComplex, match="characters"):
        specs.choice_spec(["x" * 1000] * 300)
    with pytest.raises(GrammarTooComplex, match="characters"):
        specs.json_spec({"enum": ["x" * 1000] * 300})


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_schema_of_the_corpus_is_within_the_bounds(name):
    assert compiled(SCHEMAS[name]) == specs.from_json_schema(SCHEMAS[name])
