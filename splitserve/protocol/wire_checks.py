"""What a field of a wire message may hold: small specs (Int, Float, Str, Items) that compile into
the checks the decoder runs on every value it reads (field_specs.py says
which field gets which spec).

A check takes the value MessagePack produced and returns it (a float field's int as a float) or
raises WireError. Element types are checked too, and ranges where a handler relies on them, so
that a message that decodes is one no handler can trip over: a token id is an int (never a bool,
a float or a list), within int32 when an engine indexes with it.

Lists are checked the fastest way measured for their element type (a Python loop for ints; for
floats and strings a few passes in C: set(map(type, v)), sum, str.join): the decoder reads
thousands of TokenBatches and TextBatches a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT32_MAX = 2**31 - 1

Check = Callable[[Any], Any]


class WireError(ValueError):
    """A value that is not what its field may hold (protocol.ProtocolError derives from it)."""


@dataclass(frozen=True)
class Int:
    """An int (not a bool) in [lo, hi]. Wire ints are counts, ids and indices: none negative."""

    lo: int = 0
    hi: int = INT64_MAX


@dataclass(frozen=True)
class Float:
    """A float (an int is taken as one) in [lo, hi], never NaN or +inf; -inf only when
    neg_inf (a log-probability of a token the model gave no mass)."""

    lo: float = -math.inf
    hi: float = math.inf
    neg_inf: bool = False


@dataclass(frozen=True)
class Str:
    """A str of min_len to max_len characters, one of `choices` when given."""

    min_len: int = 0
    max_len: int | None = None
    choices: frozenset[str] | None = None


@dataclass(frozen=True)
class Choice:
    """An int that is one of `values`; a scalar comes back as the member of `enum` when given
    (an IntEnum's members, or some of them: a list stays a list of ints)."""

    values: frozenset[int]
    enum: type | None = None


@dataclass(frozen=True)
class Bool:
    pass


@dataclass(frozen=True)
class Items:
    """A list of min_len to max_len elements, each as `item` says."""

    item: Any
    min_len: int = 0
    max_len: int | None = None


TOKEN = Int(0, INT32_MAX)  # engines index int32 arrays with token ids, positions and counts


def compile_check(spec: Any, where: str) -> Check:
    """The check of one field (`where` names it in errors: "TokenBatch.tokens")."""
    if isinstance(spec, Items):
        return _items(spec, where)
    if isinstance(spec, Int):
        lo, hi = spec.lo, spec.hi

        def check_int(v):
            if type(v) is not int or not lo <= v <= hi:
                raise WireError(f"{where}: expected an int in [{lo}, {hi}], got {_show(v)}")
            return v

        return check_int
    if isinstance(spec, Float):
        lo, hi, neg_inf = spec.lo, spec.hi, spec.neg_inf

        def check_float(v):
            if type(v) is not float:
                if type(v) is not int:
                    raise WireError(f"{where}: expected a float, got {type(v).__name__}")
                v = float(v)
            if not lo <= v <= hi or v == math.inf or not (v == v) or (
                v == -math.inf and not neg_inf
            ):
                raise WireError(f"{where}: expected a float in [{lo}, {hi}], got {v}")
            return v

        return check_float
    if isinstance(spec, Str):
        lo_len, hi_len, choices = spec.min_len, spec.max_len, spec.choices

        def check_str(v):
            if type(v) is not str:
                raise WireError(f"{where}: expected a string, got {type(v).__name__}")
            if len(v) < lo_len or (hi_len is not None and len(v) > hi_len):
                raise WireError(f"{where}: {len(v)} characters, expected {lo_len} to {hi_len}")
            if choices is not None and v not in choices:
                raise WireError(f"{where}: {_show(v)} is not one of {sorted(choices)}")
            return v

        return check_str
    if isinstance(spec, Choice):
        values = spec.values
        members = {v: spec.enum(v) if spec.enum else v for v in values}

        def check_choice(v):
            if type(v) is not int or v not in values:
                raise WireError(f"{where}: {_show(v)} is not one of {sorted(values)}")
            return members[v]

        return check_choice
    if isinstance(spec, Bool):

        def check_bool(v):
            if type(v) is not bool:
                raise WireError(f"{where}: expected a bool, got {type(v).__name__}")
            return v

        return check_bool
    raise TypeError(f"{where}: no wire check for {spec!r}")


# Up to this many floats a Python loop beats the passes in C (set(map(type, v)), sum), which win
# beyond it (a TokenBatch's hundreds of log-probabilities). For ints the loop wins at any length.
SMALL = 16


def _items(spec: Items, where: str) -> Check:
    """A list check: the list itself (type, length), then its elements in one closure per element
    kind (a call less per list: the decoder runs these for every delta of every TextBatch)."""
    inner = spec.item
    sizes = (spec.min_len, spec.max_len, where)
    if isinstance(inner, Int):
        return _int_list(inner.lo, inner.hi, None, sizes)
    if isinstance(inner, Choice):
        return _int_list(None, None, inner.values, sizes)
    if isinstance(inner, Float):
        return _float_list(inner, sizes)
    if isinstance(inner, Str):
        return _str_list(inner, sizes)
    if callable(inner):  # a nested message's decoder, or another field check
        nested = inner

        def check_nested(v):
            _sized(v, sizes)
            return [nested(x) for x in v]

        return check_nested
    raise TypeError(f"{where}: no wire check for a list of {inner!r}")


def _sized(v: Any, sizes: tuple[int, int | None, str]) -> int:
    if type(v) is not list:
        raise WireError(f"{sizes[2]}: expected a list, got {type(v).__name__}")
    n = len(v)
    lo, hi, where = sizes
    if n < lo or (hi is not None and n > hi):
        raise WireError(f"{where}: {n} elements, expected {lo} to {hi}")
    return n


def _int_list(lo: int | None, hi: int | None, values: frozenset[int] | None, sizes) -> Check:
    """ints (never bools) in [lo, hi], or each one of `values`."""
    where = sizes[2]
    if values is not None:
        lo, hi = min(values), max(values)
        if values == frozenset(range(lo, hi + 1)):
            values = None  # the range says it all

    def check(v):
        _sized(v, sizes)
        # One pass in Python beats the passes in C here at every length measured:
        # set(map(type, v)), min and max each cost more per element than these three tests.
        for x in v:
            if type(x) is not int or x < lo or x > hi:
                raise WireError(f"{where}: expected ints in [{lo}, {hi}], got {_show(x)}")
        if values is not None and not values.issuperset(v):
            raise WireError(f"{where}: not one of {sorted(values)}")
        return v

    return check


def _float_list(spec: Float, sizes) -> Check:
    lo, hi, neg_inf, where = spec.lo, spec.hi, spec.neg_inf, sizes[2]
    bounded = lo != -math.inf or hi != math.inf

    def check(v):
        n = _sized(v, sizes)
        if n <= SMALL:
            for x in v:
                if type(x) is not float:
                    break  # an int (taken as a float) or worse: the general path below
                # NaN fails the comparisons, and +inf is never allowed
                if not lo <= x <= hi or x == math.inf or (x == -math.inf and not neg_inf):
                    raise WireError(f"{where}: expected floats in [{lo}, {hi}], got {x}")
            else:
                return v
        types = set(map(type, v))
        if types != {float}:
            if not types <= {float, int}:
                raise WireError(f"{where}: expected floats, got {_types(v)}")
            v = [float(x) for x in v]
        # the sum is finite only if every element is (or if it overflowed: looked at again)
        if not math.isfinite(sum(v)) and not all(
            math.isfinite(x) or (neg_inf and x == -math.inf) for x in v
        ):
            raise WireError(f"{where}: NaN or infinity")
        if bounded and (min(v) < lo or max(v) > hi):
            raise WireError(f"{where}: outside [{lo}, {hi}]")
        return v

    return check


def _str_list(spec: Str, sizes) -> Check:
    lo, hi, choices, where = spec.min_len, spec.max_len, spec.choices, sizes[2]
    if lo > 1:
        raise TypeError(f"{where}: strings in a list are at least 0 or 1 character long")

    def check(v):
        if not _sized(v, sizes):
            return v
        try:
            "".join(v)  # the fastest check that every element is a str
        except TypeError:
            raise WireError(f"{where}: expected strings, got {_types(v)}") from None
        if lo and not all(v):
            raise WireError(f"{where}: an empty string")
        if hi is not None and max(map(len, v)) > hi:
            raise WireError(f"{where}: a string longer than {hi} characters")
        if choices is not None and not choices.issuperset(v):
            raise WireError(f"{where}: not one of {sorted(choices)}")
        return v

    return check


def _types(v: list) -> str:
    return ", ".join(sorted({type(x).__name__ for x in v}))


def _show(v: Any) -> str:
    """A wire value in an error message: its type, and the value itself if it is short."""
    text = repr(v)
    return text if len(text) <= 40 else f"a {type(v).__name__}"
