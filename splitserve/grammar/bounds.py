"""Bounds on a client's grammar, checked before anything compiles it.

The grammar engine recurses in native code along chains of references: a Lark rule that names
the next rule, a JSON schema whose "$ref" leads to another "$ref". A long enough chain (a few
thousand links) overflows the stack and ends the process with SIGSEGV, which no exception
handler catches. The router therefore compiles in a contained child process with a small stack
(router/contained/), and these checks refuse the known shapes first, in linear time, with a
message that says which bound was passed:

- a source's size in characters, and a Lark / GBNF grammar's number of rules (a chain is at
  most that long): in the router, at C speed (specs.py's GrammarSpec constructors);
- a JSON schema's nesting depth (containers inside containers), and the longest chain of
  "$ref" links a compiler following them would stack up, for a schema and for each schema a
  Lark grammar embeds with %json: a walk in Python over the whole schema, so in the contained
  child, just before it compiles (specs.compile_spec), never on the router's event loop.

Anything these let through still compiles only in the contained child, under a time limit.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

from splitserve.grammar.matcher import GrammarError

MAX_SOURCE_CHARS = 256 << 10  # a schema or grammar as the client wrote it (as a serialized one)
MAX_SCHEMA_DEPTH = 128  # containers in containers (the grammar engine's JSON reader stops there)
# links of "$ref" one after another: schemas nest models a few levels deep, and a recursive
# schema's cycle counts once; each link costs the compiler a few KiB of stack
MAX_REF_CHAIN = 128
MAX_GRAMMAR_RULES = 512  # Lark / GBNF rules and terminals: a chain of references is at most this
# $ref targets are scanned once each; a schema whose targets overlap so much that scanning them
# would visit more than this many times its own containers is refused rather than scanned
REF_SCAN_FACTOR = 8

_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w\-]*(?:\.-?\d+)?[ \t]*(?::|::=)", re.MULTILINE)
_EMBEDDED_JSON = re.compile(r"%json\s*")


class GrammarTooComplex(GrammarError):
    """A grammar past one of this module's bounds (HTTP 400, code grammar_too_complex)."""


def check_text(text: str, what: str) -> None:
    if len(text) > MAX_SOURCE_CHARS:
        raise GrammarTooComplex(f"the {what} is over {MAX_SOURCE_CHARS} characters")


def check_rules(text: str) -> None:
    """A Lark or GBNF grammar's size and number of rules."""
    check_text(text, "grammar")
    rules = len(_RULE.findall(text))
    if rules > MAX_GRAMMAR_RULES:
        raise GrammarTooComplex(f"the grammar has {rules} rules (at most {MAX_GRAMMAR_RULES})")


def check_schema(schema: Any, where: str = "the schema") -> None:
    """A JSON schema's nesting and $ref chains within the bounds (GrammarTooComplex if not)."""
    depth, containers = _shape(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise GrammarTooComplex(f"{where} nests deeper than {MAX_SCHEMA_DEPTH} levels")
    chain = ref_chain(schema, budget=REF_SCAN_FACTOR * containers)
    if chain > MAX_REF_CHAIN:
        raise GrammarTooComplex(
            f"{where} has a chain of {chain} $ref links (at most {MAX_REF_CHAIN})"
        )


def check_embedded_schemas(text: str) -> None:
    """The schemas a Lark grammar embeds with %json, each as check_schema() bounds it."""
    decoder = json.JSONDecoder()
    for n, m in enumerate(_EMBEDDED_JSON.finditer(text), 1):
        try:
            schema, _ = decoder.raw_decode(text, m.end())
        except (ValueError, RecursionError):
            continue  # not JSON: the compiler refuses it
        check_schema(schema, f"the grammar's %json schema #{n}")


def _shape(value: Any) -> tuple[int, int]:
    """The nesting depth of a JSON value and its number of containers (objects and arrays);
    stops once past MAX_SCHEMA_DEPTH."""
    deepest = containers = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        containers += 1
        deepest = max(deepest, depth)
        if depth > MAX_SCHEMA_DEPTH:
            break
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest, containers


def ref_chain(schema: Any, budget: int) -> int:
    """The longest chain of local "$ref" links from the root, as a compiler that follows each
    reference and compiles each target once would stack them (a link back into the chain, a
    recursive schema, ends it). GrammarTooComplex when scanning the targets passes `budget`
    containers."""
    refs_of: dict[str, list[str]] = {}
    scanned = 0

    def refs_in(pointer: str) -> list[str]:
        nonlocal scanned
        if pointer not in refs_of:
            target = _resolve(schema, pointer)
            found, nodes = _local_refs(target)
            scanned += nodes
            if scanned > budget:
                raise GrammarTooComplex("the schema's $ref targets overlap too much to check")
            refs_of[pointer] = found
        return refs_of[pointer]

    depth: dict[str, int] = {}
    on_path: set[str] = set()
    stack: list[tuple[str, int]] = [("#", 0)]  # (pointer, next child to visit)
    while stack:
        pointer, i = stack[-1]
        on_path.add(pointer)
        children = refs_in(pointer)
        if i < len(children):
            stack[-1] = (pointer, i + 1)
            child = children[i]
            if child not in depth and child not in on_path:
                stack.append((child, 0))
            continue
        stack.pop()
        on_path.discard(pointer)
        depth[pointer] = 1 + max((depth.get(c, 0) for c in children), default=0)
    return depth["#"] - 1  # the root itself is no link


def _local_refs(node: Any) -> tuple[list[str], int]:
    """The distinct local pointers ("#..." refs) anywhere inside node, and the containers
    visited."""
    found: dict[str, None] = {}
    nodes = 0
    stack = [node]
    while stack:
        item = stack.pop()
        nodes += isinstance(item, dict | list)
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
                found[ref.rstrip("/") or "#"] = None  # anchors ("#name") are not followed
            stack.extend(v for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list))
    return list(found), nodes


def _resolve(schema: Any, pointer: str) -> Any:
    """The node a "#/a/b" JSON pointer names (None when it names nothing: the compiler says)."""
    node = schema
    for part in pointer.split("/")[1:]:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
