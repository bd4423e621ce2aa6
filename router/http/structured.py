"""Structured output: the one grammar a request's output must follow, from whichever of the
API's forms it came in (at most one of them):

- OpenAI's response_format: {"type": "text"}, {"type": "json_object"}, {"type": "json_schema",
  "json_schema": {"name", "schema", "strict", "description"}};
- vLLM's structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object"};
- vLLM's older guided_json, guided_regex, guided_choice, guided_grammar.

The field becomes a GrammarSpec here, on the event loop, within cheap bounds
(splitserve/grammar/bounds.py: size, nesting, $ref chains, rules); the grammar engine compiles
and checks it in a contained child process (router/http/contained.py), because its native code
can crash or run long on a hostile grammar. What is past a bound, or cannot be compiled, is a
400 naming the field. Strict or not, a schema is always enforced: output that ends with `stop`
is valid against it (`strict: false` only allows what strict mode would forbid).
"""

from __future__ import annotations

from typing import Any

from router.http.context import ServerContext
from router.http.errors import APIError
from splitserve.grammar import bounds, specs
from splitserve.grammar.bounds import GrammarTooComplex
from splitserve.grammar.matcher import GrammarError
from splitserve.grammar.specs import GrammarSpec

STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex",
                     "guided_choice", "guided_grammar")  # fmt: skip


async def output_grammar(ctx: ServerContext, body: Any) -> str:
    """The serialized grammar of the body's structured-output field ("" when none)."""
    found = output_spec(body)
    if found is None:
        return ""
    name, spec = found
    return await ctx.contained.grammar(spec, name)


def output_spec(body: Any) -> tuple[str, GrammarSpec] | None:
    """The body's structured-output field and its grammar spec (None when none)."""
    given = [name for name in STRUCTURED_FIELDS if _given(name, getattr(body, name, None))]
    if len(given) > 1:
        raise APIError(400, f"give one of {', '.join(given)}, not several", param=given[1])
    if not given:
        return None
    name = given[0]
    value = getattr(body, name)
    try:
        return name, _spec(name, value)
    except GrammarError as exc:
        raise spec_error(name, exc) from None


def spec_error(param: str, exc: GrammarError) -> APIError:
    code = "grammar_too_complex" if isinstance(exc, GrammarTooComplex) else "invalid_grammar"
    return APIError(400, f"{param}: {exc}", param=param, code=code)


def _given(name: str, value: Any) -> bool:
    if name == "response_format":
        return value is not None and value.get("type") != "text"
    return value is not None


def _spec(name: str, value: Any) -> GrammarSpec:
    if name == "response_format":
        return from_response_format(value)
    if name == "structured_outputs":
        return from_structured_outputs(value)
    if name == "guided_json":
        return specs.json_spec(_schema_value(value))
    if name == "guided_regex":
        return specs.regex_spec(value)
    if name == "guided_choice":
        return specs.choice_spec(value)
    return specs.lark_spec(value)


def from_response_format(fmt: dict[str, Any]) -> GrammarSpec:
    kind = fmt.get("type")
    if kind == "json_object":
        _only(fmt, {"type"})
        return specs.json_spec(specs.ANY_JSON_OBJECT)
    if kind == "json_schema":
        _only(fmt, {"type", "json_schema"})
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise GrammarError("json_schema must be an object with a name and a schema")
        _only(spec, {"name", "schema", "strict", "description"})
        if not isinstance(spec.get("strict", False), bool | None):
            raise GrammarError("json_schema.strict must be a boolean")
        return specs.json_spec(spec.get("schema", specs.ANY_JSON_OBJECT))
    raise GrammarError(
        f"type {kind!r} is not supported: give 'text', 'json_object' or 'json_schema'"
    )


def from_structured_outputs(so: dict[str, Any]) -> GrammarSpec:
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
        return specs.json_spec(_schema_value(value))
    if kind == "json_object":
        return specs.json_spec(specs.ANY_JSON_OBJECT)
    if kind == "regex" and isinstance(value, str):
        return specs.regex_spec(value)
    if kind == "choice" and isinstance(value, list):
        return specs.choice_spec(value)
    if kind == "grammar" and isinstance(value, str):
        return specs.lark_spec(value)
    raise GrammarError(f"{kind}: wrong type")


def _schema_value(value: Any) -> Any:
    """A schema may come as JSON text (vLLM accepts both)."""
    if isinstance(value, str):
        import json

        bounds.check_text(value, "schema")
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"not JSON: {exc.msg}") from None
        except RecursionError:
            raise GrammarTooComplex("the schema nests too deeply") from None
    return value


def _only(obj: dict[str, Any], allowed: set[str]) -> None:
    extra = set(obj) - allowed
    if extra:
        raise GrammarError(f"unknown keys {sorted(extra)} (allowed: {sorted(allowed)})")
