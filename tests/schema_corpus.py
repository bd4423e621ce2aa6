"""JSON schemas of the kinds applications send (OpenAI structured-output style, LangChain's
pydantic models, nested and recursive ones, enums, formats, patterns, unions), for the tests
that check constrained output against them with a JSON-schema validator."""

from __future__ import annotations

S = {"type": "string", "maxLength": 12}
OBJ = {"type": "object", "additionalProperties": False}


def obj(properties: dict, required: list[str] | None = None, **extra) -> dict:
    return {**OBJ, "properties": properties,
            "required": list(properties) if required is None else required, **extra}  # fmt: skip


SCHEMAS: dict[str, dict] = {
    "person": obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130}}),
    "optional_fields": obj({"title": S, "year": {"type": "integer"}, "note": S}, ["title"]),
    "enum": obj({"color": {"enum": ["red", "green", "blue"]}}),
    "const": obj({"kind": {"const": "event"}, "id": {"type": "integer", "minimum": 1}}),
    "boolean_and_null": obj({"ok": {"type": "boolean"}, "why": {"type": "null"}}),
    "number_range": obj({"x": {"type": "number", "minimum": -1, "maximum": 1}}),
    "bounded_array": obj({"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}),
    "array_of_objects": obj({"items": {"type": "array", "maxItems": 3, "items": obj(
        {"sku": S, "qty": {"type": "integer", "minimum": 1, "maximum": 99}})}}),
    "nested": obj({"user": obj({"id": {"type": "integer"}, "profile": obj(
        {"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})}),
    "pattern": obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}),
    "date_format": obj({"day": {"type": "string", "format": "date"}}),
    "any_of": obj({"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5},
                                       {"type": "null"}]}}),  # fmt: skip
    "one_of_objects": {"oneOf": [obj({"cat": S}), obj({"dog": {"type": "integer"}})]},
    "ref_defs": {"$defs": {"point": obj({"x": {"type": "integer"}, "y": {"type": "integer"}})},
                 **obj({"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}})},
    "recursive": {"$defs": {"node": obj({"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                            {"type": "null"}]}})},
                  "$ref": "#/$defs/node"},  # fmt: skip
    "string_enum_array": obj({"days": {"type": "array", "maxItems": 4,
                                       "items": {"enum": ["mon", "tue", "wed"]}}}),
    "top_level_array": {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
    "top_level_enum": {"enum": ["yes", "no", "maybe"]},
    "integer_only": {"type": "integer", "minimum": 10, "maximum": 20},
    "langchain_style": {  # what langchain-openai sends for a pydantic model
        "title": "Joke", "description": "A joke", "type": "object", "additionalProperties": False,
        "properties": {"setup": {"title": "Setup", "type": "string", "maxLength": 20},
                       "rating": {"title": "Rating", "type": "integer", "minimum": 1,
                                  "maximum": 10}},
        "required": ["setup", "rating"],
    },  # fmt: skip
}
