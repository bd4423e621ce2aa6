"""Structured output: the one grammar a request's output must follow, from whichever of the
API's forms it came in (at most one of them):

- OpenAI's response_format: {"type": "text"}, {"type": "json_object"}, {"type": "json_schema",
  "json_schema": {"name", "schema", "strict", "description"}};
- vLLM's structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object"};
- vLLM's older guided_json, guided_regex, guided_choice, guided_grammar.

The grammar engine compiles and checks it (splitserve/grammar/specs.py); what it cannot compile
is a 400 naming the field. Strict or not, a schema is always enforced: output that ends with
`stop` is valid against it (`strict: false` only allows what strict mode would forbid).
"""

from __future__ import annotations

from typing import Any

from router.http.errors import APIError
from splitserve.grammar import specs
from splitserve.grammar.matcher import GrammarError

STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex",
                     "guided_choice", "guided_grammar")  # fmt: skip


def output_grammar(body: Any) -> str:
    """The serialized grammar of the body's structured-output field ("" when none)."""
    given = [name for name in STRUCTURED_FIELDS if _given(name, getattr(body, name, None))]
    if len(given) > 1:
        raise APIError(400, f"give one of {', '.join(given)}, not several", param=given[1])
    if not given:
        return ""
    name = given[0]
    value = getattr(body, name)
    try:
        return _compile(name, value)
    except GrammarError as exc:
        raise APIError(400, f"{name}: {exc}", param=name, code="invalid_grammar") from None


def _given(name: str, value: Any) -> bool:
    if name == "response_format":
        return value is not None and value.get("type") != "text"
    return value is not None


def _compile(name: str, value: Any) -> str:
    if name == "response_format":
        return from_response_format(value)
    if name == "structured_outputs":
        return from_structured_outputs(value)
    if name == "guided_json":
        return specs.from_json_schema(_schema_value(value))
    if name == "guided_regex":
        return specs.from_regex(value)
    if name == "guided_choice":
        return specs.from_choice(value)
    return specs.from_lark(value)


def from_response_format(fmt: dict[str, Any]) -> str:
    kind = fmt.get("type")
    if kind == "json_object":
        _only(fmt, {"type"})
        return specs.from_json_schema(specs.ANY_JSON_OBJECT)
    if kind == "json_schema":
        _only(fmt, {"type", "json_schema"})
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise GrammarError("json_schema must be an object with a name and a schema")
        _only(spec, {"name", "schema", "strict", "description"})
        if not isinstance(spec.get("strict", False), bool | None):
            raise GrammarError("json_schema.strict must be a boolean")
        return specs.from_json_schema(spec.get("schema", specs.ANY_JSON_OBJECT))
    raise GrammarError(
        f"type {kind!r} is not supported: give 'text', 'json_object' or 'json_schema'"
    )


def from_structured_outputs(so: dict[str, Any]) -> str:
    known = {"json", "regex", "choice", "grammar", "json_object"}
    refused = {k for k, v in so.items() if k not in known and v not in (None, False, "")}
    if refused:
        raise GrammarError(f"{sorted(refused)} not supported (give one of {sorted(known)})")
    given = [k for k in known if so.get(k) not in (None, False)]
    if len(given) != 1:
        raise GrammarError(f"give exactly one of {sorted(known)}")
    kind = given[0]
    value = so[kind]
    if kind == "json":
        return specs.from_json_schema(_schema_value(value))
    if kind == "json_object":
        return specs.from_json_schema(specs.ANY_JSON_OBJECT)
    if kind == "regex" and isinstance(value, str):
        return specs.from_regex(value)
    if kind == "choice" and isinstance(value, list):
        return specs.from_choice(value)
    if kind == "grammar" and isinstance(value, str):
        return specs.from_lark(value)
    raise GrammarError(f"{kind}: wrong type")


def _schema_value(value: Any) -> Any:
    """A schema may come as JSON text (vLLM accepts both)."""
    if isinstance(value, str):
        import json

        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"not JSON: {exc.msg}") from None
    return value


def _only(obj: dict[str, Any], allowed: set[str]) -> None:
    extra = set(obj) - allowed
    if extra:
        raise GrammarError(f"unknown keys {sorted(extra)} (allowed: {sorted(allowed)})")
