"""Grammars that overflow the grammar engine's native stack, shared by the
tests of the bounds, the contained children and the router."""

from __future__ import annotations


def lark_chain(n: int) -> str:
    """start -> r0 -> r1 -> ... -> rn: each rule names the next."""
    rules = [f'r{i}: "a" r{i + 1}' for i in range(n)]
    return "\n".join(["start: r0", *rules, f'r{n}: "z"'])


def ref_chain(n: int) -> dict:
    """A schema whose $ref leads through n definitions, each a $ref to the next."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def deep_refs(links: int = 64, depth: int = 40) -> dict:
    """A $ref chain of `links` links (under its bound), each definition nesting `depth` arrays
    (under the nesting bound) before the next link: the engine's recursion follows both, and
    overflows an 8 MiB stack."""
    defs = {}
    for i in range(links):
        node: dict = {"$ref": f"#/$defs/d{i + 1}"}
        for _ in range(depth):
            node = {"type": "array", "items": node}
        defs[f"d{i}"] = node
    defs[f"d{links}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}
