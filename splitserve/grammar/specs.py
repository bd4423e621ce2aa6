"""Grammars from the forms a request gives them in: llguidance's serialized grammar (the one
string that travels with the request), checked before the request is admitted.

A client's grammar is first a GrammarSpec (its kind and text, within bounds.py's cheap bounds,
made in the router's event loop); compile_spec() checks the rest of the bounds and turns it
into the serialized grammar, which the router runs in a contained child process
(router/contained/), never in its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import llguidance

from splitserve.grammar import bounds
from splitserve.grammar.bounds import GrammarTooComplex
from splitserve.grammar.matcher import GrammarError

MAX_GRAMMAR_CHARS = 256 << 10  # a serialized grammar (schemas of thousands of fields fit)
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
# JSON as OpenAI writes it (", " and ": ", no other whitespace): vLLM's --disable-any-whitespace.
# Free whitespace lets a small model (or the fake engine) pad output with it until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar as a request gave it, checked against bounds.py but not compiled: kind "json"
    (text: the schema as JSON), "regex", "choice" (text: the choices as JSON) or "lark"."""

    kind: str
    text: str


def json_spec(schema: Any) -> GrammarSpec:
    if not isinstance(schema, dict | bool):
        raise GrammarError("a JSON schema must be an object (or true / false)")
    try:
        text = json.dumps(schema)
    except RecursionError:
        raise GrammarTooComplex(
            f"the schema nests deeper than {bounds.MAX_SCHEMA_DEPTH} levels"
        ) from None
    bounds.check_text(text, "schema")
    return GrammarSpec("json", text)


def regex_spec(pattern: Any) -> GrammarSpec:
    if not isinstance(pattern, str):
        raise GrammarError("a regex must be a string")
    bounds.check_text(pattern, "regex")
    return GrammarSpec("regex", pattern)


def choice_spec(choices: Any) -> GrammarSpec:
    if not isinstance(choices, list) or not choices:
        raise GrammarError("choices must be a non-empty list of non-empty strings")
    text = json.dumps(choices)
    bounds.check_text(text, "list of choices")
    return GrammarSpec("choice", text)


def lark_spec(text: Any) -> GrammarSpec:
    if not isinstance(text, str):
        raise GrammarError("a grammar must be a string")
    bounds.check_rules(text)
    return GrammarSpec("lark", text)


def compile_spec(spec: GrammarSpec) -> str:
    """The serialized grammar of a spec: the rest of bounds.py's checks, then the compiler
    (GrammarError when either refuses it). Native code that may recurse as deep as the grammar's
    chains: run it contained (router/contained/)."""
    if spec.kind == "json":
        bounds.check_schema(json.loads(spec.text))
        return from_json_text(spec.text)
    if spec.kind == "regex":
        return from_regex(spec.text)
    if spec.kind == "choice":
        return from_choice(json.loads(spec.text))
    if spec.kind == "lark":
        bounds.check_embedded_schemas(spec.text)
        return from_lark(spec.text)
    raise GrammarError(f"no grammar of kind {spec.kind!r}")


def from_json_schema(schema: Any) -> str:
    """A JSON schema (an object, or true / false) -> grammar; GrammarError if llguidance cannot
    compile it (an unknown or unsupported keyword is an error, never silently dropped)."""
    if not isinstance(schema, dict | bool):
        raise GrammarError("a JSON schema must be an object (or true / false)")
    return from_json_text(json.dumps(schema))


def from_json_text(text: str) -> str:
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"invalid JSON schema: {exc}") from None
    return checked(grammar)


# A regex means what it means in a JSON schema's "pattern" (ECMA-262), as OpenAI, vLLM and
# outlines take it: \d is [0-9] and \w [0-9a-zA-Z_], never any Unicode digit or letter (a
# client asking for \d+ parses the output with int()). \s stays Unicode whitespace, as in
# ECMA-262. The grammar engine's own regexes follow Rust's regex crate (Unicode classes).
REGEX_ASCII_CLASSES = "dw"


def from_regex(pattern: str) -> str:
    if not isinstance(pattern, str):
        raise GrammarError("a regex must be a string")
    lark = llguidance.regex_to_lark(pattern, REGEX_ASCII_CLASSES)
    return checked(llguidance.LLMatcher.grammar_from_lark(f"start: /{lark}/"))


def from_choice(choices: list[str]) -> str:
    """Exactly one of the strings."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError("choices must be a non-empty list of non-empty strings")
    return checked(llguidance.grammar_from("choice", json.dumps(choices)))


def from_lark(text: str) -> str:
    """A Lark grammar (llguidance's dialect: %json { schema } embeds a JSON schema), or a GBNF
    grammar as llama.cpp writes them (converted to Lark by llguidance)."""
    try:
        grammar = llguidance.grammar_from("grammar", text)
    except ValueError as exc:
        raise GrammarError(str(exc)) from None
    return checked(grammar)


def checked(grammar: str) -> str:
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is over {MAX_GRAMMAR_CHARS} characters")
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    if error:
        raise GrammarError(error.strip())
    return grammar
