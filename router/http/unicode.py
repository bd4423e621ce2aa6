"""Lone UTF-16 surrogates in a JSON body: refused, naming the field that holds one.

JSON may spell a character as "\\udfff", and Python's json module decodes a lone surrogate escape
into a str that is not valid Unicode: it cannot be encoded to UTF-8, so it fails wherever it next
meets the outside world (the tokenizer, the wire codec, a log handler), long after the request was
accepted. pydantic in strict mode lets it through too. Rather than guard every consumer, the body
is checked once, as it is parsed.

The check is cheap for nearly every body: a lone surrogate can only come from a "\\uD800" to
"\\uDFFF" escape (a raw one is invalid UTF-8, refused by the decoder), so the decoded value is
walked only when the text holds such an escape (surrogate pairs, as json.dumps writes emoji, also
match; the walk then finds nothing).
"""

from __future__ import annotations

import re
from typing import Any

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def may_hold_surrogates(text: str) -> bool:
    return SURROGATE_ESCAPE.search(text) is not None


def find_lone_surrogate(value: Any) -> list[str] | None:
    """The path (keys and list indices, as strings) to the first string or object key in a
    decoded JSON value that is not valid Unicode; None when there is none. Iterative: a body
    nested as deep as the JSON decoder allows must not overflow the stack here."""
    stack: list[tuple[list[str], Any]] = [([], value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if not _valid(v):
                return path
        elif isinstance(v, dict):
            for key in v:
                if not _valid(key):
                    return [*path, printable(key)]
            # reversed: the stack pops them in the body's own order, so the first one is named
            stack.extend(([*path, k], item) for k, item in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend(([*path, str(i)], v[i]) for i in range(len(v) - 1, -1, -1))
    return None


def printable(s: str) -> str:
    """s with its surrogates written as escapes, safe to put in a message or a log line."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _valid(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
