"""A small TOML writer for the resolved cluster config handed to child processes.

Covers what config_to_dict produces: tables of strings, numbers, booleans, lists and nested tables.
"""

from __future__ import annotations

import json
from typing import Any


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _table(lines: list[str], path: list[str], table: dict[str, Any]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not tables):
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for k, v in scalars.items():
        lines.append(f"{_key(k)} = {_value(v)}")
    if scalars:
        lines.append("")
    for k, v in tables.items():
        _table(lines, path + [k], v)


def dumps(data: dict[str, Any]) -> str:
    lines: list[str] = []
    _table(lines, [], data)
    return "\n".join(lines) + "\n"
