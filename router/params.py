"""Generation parameters: the one table of their bounds, read by the HTTP schemas and the core.

BOUNDS says, per numeric field of RequestParams, which values a request may ask for; the HTTP
schemas build their pydantic fields from it (so a bad value is a 400 naming the field before
anything else runs) and validate() checks every request the core is given against the same table
and against the model (its vocabulary and context).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from router.requests import InvalidRequest, RequestParams

MAX_SEED = 2**63 - 1
MAX_TOKENS = 1 << 20  # max_tokens beyond any context; validate() clamps it to the context
MAX_TOP_K = 1 << 20
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 1024  # characters per stop string
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class Bound:
    """A closed range [lo, hi], or (lo, hi] when lo_open."""

    lo: float
    hi: float
    lo_open: bool = False

    def __contains__(self, value: Any) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        return above and value <= self.hi

    def describe(self) -> str:
        return f"{'(' if self.lo_open else '['}{self.lo}, {self.hi}]"

    def pydantic(self) -> dict[str, float]:
        """The bound as pydantic Field keywords."""
        return {"gt" if self.lo_open else "ge": self.lo, "le": self.hi}


BOUNDS: dict[str, Bound] = {
    "max_tokens": Bound(1, MAX_TOKENS),
    "min_tokens": Bound(0, MAX_TOKENS),
    "temperature": Bound(0.0, 2.0),  # OpenAI's range
    "top_p": Bound(0.0, 1.0, lo_open=True),
    "top_k": Bound(0, MAX_TOP_K),  # 0: off (the HTTP API also takes vLLM's -1 for off)
    "seed": Bound(0, MAX_SEED),
}


def validate(
    prompt: list[int], p: RequestParams, vocab_size: int, max_seq_len: int
) -> RequestParams:
    """The request as the pipeline will run it (max_tokens clamped to the room the context
    leaves), or InvalidRequest naming the first field that is out of bounds."""
    if not prompt:
        raise InvalidRequest("the prompt is empty", "prompt")
    if any(type(t) is not int or not 0 <= t < vocab_size for t in prompt):
        raise InvalidRequest(f"prompt token ids must be in [0, {vocab_size})", "prompt")
    room = max_seq_len - len(prompt)
    if room < 1:
        raise InvalidRequest(
            f"the prompt has {len(prompt)} tokens; this model's context is {max_seq_len}"
            " tokens, which leaves no room for output",
            "prompt",
        )
    for name, bound in BOUNDS.items():
        value = getattr(p, name)
        if value is not None and value not in bound:
            raise InvalidRequest(f"{name} must be in {bound.describe()}", name)
    if p.min_tokens > p.max_tokens:
        raise InvalidRequest("min_tokens must be between 0 and max_tokens", "min_tokens")
    if len(p.stop) > MAX_STOP or any(not 1 <= len(s) <= MAX_STOP_CHARS for s in p.stop):
        raise InvalidRequest(
            f"at most {MAX_STOP} stop strings, each of 1-{MAX_STOP_CHARS} characters", "stop"
        )
    if len(p.stop_token_ids) > MAX_STOP_TOKEN_IDS or any(
        not 0 <= t < vocab_size for t in p.stop_token_ids
    ):
        raise InvalidRequest(
            f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids, each in [0, {vocab_size})",
            "stop_token_ids",
        )
    if p.max_tokens > room:
        p = replace(p, max_tokens=room, min_tokens=min(p.min_tokens, room))
    return p
