"""A request's parameters: the types they travel in, and the one table of their bounds.

SamplingParams, LogitsControls, StopCriteria and DetokParams ride inside GenerateRequest and the
messages that follow from it (the engine applies the first two: splitserve/engine/interface.py
says in which order). LIMITS holds, per request parameter, what a client may ask for (`client`:
the router's HTTP schemas build their fields from it, and router/params.py checks every request
the core is given against it) and what a message may carry (`wire`: PARAM_SPECS below, which the
decoder checks every such message against). The two are one bound unless the row says why the
wire takes more: the reasons are the WIRE_* notes just above the table.

A new request parameter goes in one of these types, with its row in LIMITS and its field's spec in
PARAM_SPECS; then the router's HTTP field (router/http/schemas.py), RequestParams
(router/requests.py) and what turns it into the wire type (router/core.py, router/params.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from splitserve.protocol.wire_checks import (
    INT32_MAX,
    INT64_MAX,
    TOKEN,
    Float,
    Int,
    Items,
    Str,
    WireError,
    compile_check,
)

MAX_SEED = INT64_MAX
MAX_TOKENS = 1 << 20  # max_tokens beyond any context; validate() refuses what the context cannot
MAX_TOP_K = 1 << 20
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's limit)
MAX_LOGIT_BIAS = 1024  # entries of one request's logit bias
MAX_BAD_WORDS = 128  # token sequences (each word is tokenized with and without a leading space)
MAX_BAD_WORD_TOKENS = 32  # tokens of one bad word
NO_PROMPT_LOGPROBS = -1  # LogitsControls.prompt_logprobs when the client asked for none
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 1024  # characters per stop string
MAX_STOP_TOKEN_IDS = 64
# The wire's bounds of the stop strings, wider than a client's (WIRE_FRAME)
MAX_WIRE_STOPS = 64
MAX_WIRE_STOP_CHARS = 4096

# The sampler computes in float32 on hardware that flushes subnormal numbers to zero: below
# FLOAT32_TINY, float32's smallest normal number, a top_p or a repetition penalty would reach it
# as 0 (top_p would keep no token at all).
FLOAT32_TINY = 2.0**-126
# logits / temperature must not overflow float32 (3.4e38): with this floor it cannot for logits
# up to 3e26 in size, far beyond any model's (below it, a tiny temperature sampled token 0,
# whatever the logits said).
MIN_TEMPERATURE = 1e-12


@dataclass(frozen=True)
class Bound:
    """A closed range [lo, hi], or (lo, hi] when lo_open; optionally with a floor: values above
    lo but below the floor are out of float32's resolution, and are either refused (refuse_below)
    or raised to the floor (when that changes nothing, see top_p)."""

    lo: float
    hi: float
    lo_open: bool = False
    floor: float | None = None
    refuse_below: bool = True

    def __contains__(self, value: Any) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        if self.floor is not None and self.refuse_below and self.lo < value < self.floor:
            return False
        return above and value <= self.hi

    def resolve(self, value: Any) -> Any:
        """The value the pipeline runs with (value is in the bound)."""
        if self.floor is not None and not self.refuse_below and value < self.floor:
            return self.floor
        return value

    def describe(self) -> str:
        if self.floor is not None and self.refuse_below:
            return f"{self.lo} or in [{self.floor}, {self.hi}]"
        return f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}]"

    def pydantic(self) -> dict[str, float]:
        """The bound as pydantic Field keywords (the floor is validate()'s to check)."""
        return {"gt" if self.lo_open else "ge": self.lo, "le": self.hi}

    def admitted(self) -> tuple[float, float]:
        """The least closed range that holds every value a request runs with: a value below the
        floor is refused or raised to it, an open end has a floor above it, and a closed one is
        itself admitted (temperature's 0, greedy)."""
        if self.floor is None:
            if self.lo_open:
                raise ValueError("an open bound without a floor has no closed range")
            return self.lo, self.hi
        return (self.floor if self.lo_open or not self.refuse_below else self.lo), self.hi


@dataclass(frozen=True)
class Limit:
    """One request parameter's bounds: `client`, what a request may ask for; `wire`, what a
    message may carry (None: the values the client's bound admits), and `why` the wire takes
    more. For a list, both bound its length and `item` its elements (a string's characters, a
    bad word's tokens)."""

    client: Bound
    wire: Bound | None = None
    why: str = ""
    item: Limit | None = None

    def on_wire(self) -> tuple[float, float]:
        return (self.wire.lo, self.wire.hi) if self.wire is not None else self.client.admitted()


# Why the wire takes more than a client may send, where it does. A client's bound is the API's
# (OpenAI's and vLLM's ranges, what the router serves); the wire's is what a worker relies on so
# that no message can trip it. (The prompt is not a row: the model's context bounds a client's,
# which router/params.py checks, and a resumed request's prompt on the wire also holds its output
# so far, so only the receiver's frame bounds it there.)
WIRE_INT32 = (
    "a worker relies only on it fitting the int32 arrays it indexes with it; a client's bound"
    " is beyond any context, and router/params.py refuses what the model's context cannot hold"
)
WIRE_GREEDY = (
    "the sampler needs only a value of at least 0 (0 is greedy); the gap below the floor and the"
    " top of 2 are the API's"
)
WIRE_NONE = "NO_PROMPT_LOGPROBS (-1) is how a request without prompt logprobs travels"
WIRE_FRAME = (
    "the receivers' largest frame is sized from the wire's bound (splitserve/message_limits.py),"
    " so the router's may grow up to it without a new protocol version"
)

LIMITS: dict[str, Limit] = {
    "max_tokens": Limit(Bound(1, MAX_TOKENS), Bound(1, INT32_MAX), WIRE_INT32),
    "min_tokens": Limit(Bound(0, MAX_TOKENS), Bound(0, INT32_MAX), WIRE_INT32),
    # OpenAI's range; 0 is greedy, and a temperature between 0 and the floor is refused (it
    # would overflow, see MIN_TEMPERATURE) rather than guessed at: the client may mean greedy.
    "temperature": Limit(
        Bound(0.0, 2.0, floor=MIN_TEMPERATURE), Bound(0.0, math.inf), WIRE_GREEDY
    ),
    # Raising a top_p below FLOAT32_TINY to it is exact, not a guess: top_p keeps the smallest set
    # of most likely tokens whose mass reaches top_p, and the most likely token alone has mass at
    # least 1 / vocabulary size, far above the floor, so every top_p up to that keeps the same set.
    "top_p": Limit(Bound(0.0, 1.0, lo_open=True, floor=FLOAT32_TINY, refuse_below=False)),
    # 0: off (the HTTP API also takes vLLM's -1 for off)
    "top_k": Limit(Bound(0, MAX_TOP_K), Bound(0, INT32_MAX), WIRE_INT32),
    "seed": Limit(Bound(0, MAX_SEED)),
    "presence_penalty": Limit(Bound(-2.0, 2.0)),  # OpenAI's ranges
    "frequency_penalty": Limit(Bound(-2.0, 2.0)),
    # vLLM's: above 1 discourages repeats, below encourages; 0 would divide by zero
    "repetition_penalty": Limit(Bound(0.0, 2.0, lo_open=True, floor=FLOAT32_TINY)),
    "min_p": Limit(Bound(0.0, 1.0)),
    "top_logprobs": Limit(Bound(0, MAX_TOP_LOGPROBS)),
    "prompt_logprobs": Limit(
        Bound(0, MAX_TOP_LOGPROBS), Bound(NO_PROMPT_LOGPROBS, MAX_TOP_LOGPROBS), WIRE_NONE
    ),
    # ---- lists: how many, then each one ----
    "stop": Limit(Bound(0, MAX_STOP), Bound(0, MAX_WIRE_STOPS), WIRE_FRAME,
                  item=Limit(Bound(1, MAX_STOP_CHARS), Bound(1, MAX_WIRE_STOP_CHARS), WIRE_FRAME)),
    # each id within the model's vocabulary (router/params.py), on the wire any token id
    "stop_token_ids": Limit(Bound(0, MAX_STOP_TOKEN_IDS), Bound(0, math.inf), WIRE_FRAME,
                            item=Limit(Bound(0, INT32_MAX))),
    "logit_bias": Limit(Bound(0, MAX_LOGIT_BIAS), item=Limit(Bound(-100.0, 100.0))),  # OpenAI's
    "bad_words": Limit(Bound(0, MAX_BAD_WORDS), item=Limit(Bound(1, MAX_BAD_WORD_TOKENS))),
}  # fmt: skip


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. temperature 0 means greedy; top_k 0 and top_p 1 mean off.

    The router always sets a seed (a random one when the client gave none), so that the token
    at output position i depends only on (seed, i, logits), whatever else shares the batch.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0


@dataclass(frozen=True)
class LogitsControls:
    """One request's logits processing beyond SamplingParams (splitserve/engine/interface.py
    gives the order an engine applies them in). Neutral values mean off; a request whose controls
    are all neutral sends None."""

    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # (0, 2]; 1 is off
    # sparse logit bias: bias_values[i] is added to the logit of bias_ids[i]; ids unique
    bias_ids: list[int] = field(default_factory=list)
    bias_values: list[float] = field(default_factory=list)  # [-100, 100]
    min_p: float = 0.0  # [0, 1]: keep tokens of probability >= min_p x the largest
    bad_words: list[list[int]] = field(default_factory=list)  # token sequences never completed
    top_logprobs: int = 0  # alternatives returned per sampled token, 0..MAX_TOP_LOGPROBS
    # the prompt's own logprobs with this many alternatives per token (-1: none); only for a
    # prefill at output position 0 (a resumed request has had them)
    prompt_logprobs: int = NO_PROMPT_LOGPROBS

    def outside(self, vocab_size: int) -> str | None:
        """Why these controls name a token the engine does not have, or None: a worker checks
        before it hands them over (an id outside the logits indexed out of bounds there)."""
        ids = [*self.bias_ids, *(t for word in self.bad_words for t in word)]
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            return f"logit bias or bad words name token {bad}, not in the vocabulary ({vocab_size})"
        return None

    @property
    def needs_history(self) -> bool:
        """The engine must know the request's tokens so far (penalties count them, bad words
        match their end): its Prefix then carries them (Prefix.context)."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
            or self.bad_words
        )  # fmt: skip


@dataclass(frozen=True)
class StopCriteria:
    """Token-level finish rules, applied by the prefill worker (token 0) and the decode worker."""

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    eos_ids: list[int] = field(default_factory=list)  # the tokenizer's eos ids
    stop_token_ids: list[int] = field(default_factory=list)  # the client's extra stop ids


@dataclass(frozen=True)
class DetokParams:
    """How the pinned detok worker turns a request's tokens into text."""

    skip_special_tokens: bool = True
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    min_tokens: int = 0  # stop strings are looked for only from this many output tokens on


# ---- the wire's checks of these types, from LIMITS --------------------------------------------


def _int(name: str) -> Int:
    lo, hi = LIMITS[name].on_wire()
    return Int(int(lo), int(hi))


def _float(name: str) -> Float:
    return Float(*LIMITS[name].on_wire())


def _count(limit: Limit) -> tuple[int, int | None]:
    """A list's (min_len, max_len) on the wire; None: only the frame bounds it."""
    lo, hi = limit.on_wire()
    return int(lo), None if hi == math.inf else int(hi)


def _items(name: str, item: Any) -> Items:
    return Items(item, *_count(LIMITS[name]))


_STOP_CHARS = _count(LIMITS["stop"].item)
_BAD_WORD = _count(LIMITS["bad_words"].item)

PARAM_SPECS: dict[type, dict[str, Any]] = {
    SamplingParams: {
        "temperature": _float("temperature"),
        "top_p": _float("top_p"),
        "top_k": _int("top_k"),
        "seed": _int("seed"),
    },
    LogitsControls: {
        "presence_penalty": _float("presence_penalty"),
        "frequency_penalty": _float("frequency_penalty"),
        "repetition_penalty": _float("repetition_penalty"),
        "bias_ids": _items("logit_bias", TOKEN),
        "bias_values": _items("logit_bias", Float(*LIMITS["logit_bias"].item.on_wire())),
        "min_p": _float("min_p"),
        "bad_words": _items(
            "bad_words",
            compile_check(Items(TOKEN, *_BAD_WORD), "LogitsControls.bad_words"),
        ),
        "top_logprobs": _int("top_logprobs"),
        "prompt_logprobs": _int("prompt_logprobs"),
    },
    StopCriteria: {
        "max_tokens": _int("max_tokens"),
        "min_tokens": _int("min_tokens"),
        "eos_ids": Items(TOKEN),
        "stop_token_ids": _items("stop_token_ids", TOKEN),
    },
    DetokParams: {
        "stop": _items("stop", Str(*_STOP_CHARS)),
        "min_tokens": _int("min_tokens"),
    },
}


def _controls(m: LogitsControls) -> None:
    if len(m.bias_ids) != len(m.bias_values):
        raise WireError("LogitsControls: bias_ids and bias_values differ in length")
    if len(set(m.bias_ids)) != len(m.bias_ids):
        raise WireError("LogitsControls: bias_ids repeat")


# checks across the fields of one of these, after each field's own
PARAM_CHECKS = {LogitsControls: _controls}
