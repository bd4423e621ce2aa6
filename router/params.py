"""Generation parameters: the one table of their bounds, read by the HTTP schemas and the core.

BOUNDS says, per numeric field of RequestParams, which values a request may ask for; the HTTP
schemas build their pydantic fields from it (so a bad value is a 400 naming the field before
anything else runs) and validate() checks every request the core is given against the same table
and against the model (its vocabulary and context). Values the float32 sampler cannot honour are
refused, or resolved to the value it runs exactly (see the floors of temperature and top_p, and
top_k beyond the vocabulary).

max_tokens beyond the room the context leaves is refused (400), as vLLM does, not clamped: a
client that asked for more than can be generated learns it at once instead of finding a
`length` finish it did not ask for. (An endpoint that is not given max_tokens asks for the room.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from router.requests import InvalidRequest, RequestParams
from splitserve.engine.interface import (
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    NO_PROMPT_LOGPROBS,
    LogitsControls,
)
from splitserve.grammar.specs import MAX_GRAMMAR_CHARS
from splitserve.protocol import FLOAT32_TINY

MAX_SEED = 2**63 - 1
MAX_TOKENS = 1 << 20  # max_tokens beyond any context; validate() refuses what the context cannot
MAX_TOP_K = 1 << 20
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 1024  # characters per stop string
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20


# The sampler computes in float32 on hardware that flushes subnormal numbers to zero;
# FLOAT32_TINY, float32's smallest normal number, is also the least top_p the wire accepts.
# logits / temperature must not overflow float32 (3.4e38): with this floor it cannot for logits
# up to 3e26 in size, far beyond any model's. Measured before the floor: temperature 1e-37 on
# logits of about 90 sampled token 0, whatever the logits said.
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


BOUNDS: dict[str, Bound] = {
    "max_tokens": Bound(1, MAX_TOKENS),
    "min_tokens": Bound(0, MAX_TOKENS),
    # OpenAI's range; 0 is greedy, and a temperature between 0 and the floor is refused (it
    # would overflow, see MIN_TEMPERATURE) rather than guessed at: the client may mean greedy.
    "temperature": Bound(0.0, 2.0, floor=MIN_TEMPERATURE),
    # A top_p below FLOAT32_TINY would reach the sampler as 0 (a subnormal is flushed) and keep
    # no token at all: measured, 1e-38 sampled tokens of logprob -8 to -13 instead of the greedy
    # one. Raising it to the floor is exact, not a guess: top_p keeps the smallest set of most
    # likely tokens whose mass reaches top_p, and the most likely token alone has mass at least
    # 1 / vocabulary size, far above the floor, so every top_p up to that keeps the same set.
    "top_p": Bound(0.0, 1.0, lo_open=True, floor=FLOAT32_TINY, refuse_below=False),
    "top_k": Bound(0, MAX_TOP_K),  # 0: off (the HTTP API also takes vLLM's -1 for off)
    "seed": Bound(0, MAX_SEED),
    "presence_penalty": Bound(-2.0, 2.0),  # OpenAI's ranges
    "frequency_penalty": Bound(-2.0, 2.0),
    # vLLM's: above 1 discourages repeats, below encourages; 0 would divide by zero
    "repetition_penalty": Bound(0.0, 2.0, lo_open=True, floor=FLOAT32_TINY),
    "min_p": Bound(0.0, 1.0),
    "top_logprobs": Bound(0, MAX_LOGPROBS),
    "prompt_logprobs": Bound(0, MAX_LOGPROBS),
}
LOGIT_BIAS = Bound(-100.0, 100.0)  # OpenAI's range of each bias


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
    resolved = {}
    for name, bound in BOUNDS.items():
        value = getattr(p, name)
        if value is not None and value not in bound:
            raise InvalidRequest(f"{name} must be {bound.describe()}", name)
        if value is not None and bound.resolve(value) != value:
            resolved[name] = bound.resolve(value)
    if p.min_tokens > p.max_tokens:
        raise InvalidRequest("min_tokens must be between 0 and max_tokens", "min_tokens")
    if len(p.stop) > MAX_STOP or any(not 1 <= len(s) <= MAX_STOP_CHARS for s in p.stop):
        raise InvalidRequest(
            f"at most {MAX_STOP} stop strings, each of 1-{MAX_STOP_CHARS} characters", "stop"
        )
    if not all(_is_text(s) for s in p.stop):
        raise InvalidRequest("stop strings must be valid Unicode (no lone surrogates)", "stop")
    if len(p.stop_token_ids) > MAX_STOP_TOKEN_IDS or any(
        not 0 <= t < vocab_size for t in p.stop_token_ids
    ):
        raise InvalidRequest(
            f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids, each in [0, {vocab_size})",
            "stop_token_ids",
        )
    if p.top_k >= vocab_size:  # exact: the top vocabulary-size tokens are all of them
        resolved["top_k"] = 0
    if p.max_tokens > room:
        raise InvalidRequest(
            f"this model's maximum context length is {max_seq_len} tokens; the request asks"
            f" for {len(prompt) + p.max_tokens} ({len(prompt)} of prompt, {p.max_tokens} of"
            f" output): reduce max_tokens to at most {room}, or the prompt",
            "max_tokens",
        )
    _validate_controls(p, vocab_size)
    return replace(p, **resolved) if resolved else p


def _validate_controls(p: RequestParams, vocab_size: int) -> None:
    ids = [t for t, _ in p.logit_bias]
    if len(ids) > MAX_LOGIT_BIAS or len(set(ids)) != len(ids):
        raise InvalidRequest(f"logit_bias: at most {MAX_LOGIT_BIAS} distinct token ids",
                             "logit_bias")  # fmt: skip
    if any(type(t) is not int or not 0 <= t < vocab_size for t in ids):
        raise InvalidRequest(f"logit_bias: token ids must be in [0, {vocab_size})", "logit_bias")
    if any(b not in LOGIT_BIAS for _, b in p.logit_bias):
        raise InvalidRequest(f"logit_bias: each bias must be {LOGIT_BIAS.describe()}",
                             "logit_bias")  # fmt: skip
    if len(p.bad_words) > MAX_BAD_WORDS or any(
        not 1 <= len(w) <= MAX_BAD_WORD_TOKENS or not all(0 <= t < vocab_size for t in w)
        for w in p.bad_words
    ):
        raise InvalidRequest(
            f"bad_words: at most {MAX_BAD_WORDS} token sequences (a word counts once with and"
            f" once without a leading space) of 1-{MAX_BAD_WORD_TOKENS} tokens", "bad_words",
        )  # fmt: skip
    if len(p.grammar) > MAX_GRAMMAR_CHARS:
        raise InvalidRequest(f"the output's grammar is over {MAX_GRAMMAR_CHARS} characters",
                             "response_format")  # fmt: skip


def logits_controls(p: RequestParams) -> LogitsControls | None:
    """The request's LogitsControls, or None when every control is neutral (the plain path)."""
    controls = LogitsControls(
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
        bias_ids=[t for t, _ in p.logit_bias],
        bias_values=[float(b) for _, b in p.logit_bias],
        min_p=p.min_p,
        bad_words=[list(w) for w in p.bad_words],
        top_logprobs=p.top_logprobs if p.logprobs else 0,
        prompt_logprobs=NO_PROMPT_LOGPROBS if p.prompt_logprobs is None else p.prompt_logprobs,
    )
    return None if controls == NEUTRAL else controls


NEUTRAL = LogitsControls()


def _is_text(s: str) -> bool:
    """Encodable as UTF-8 (a str from JSON may hold a lone surrogate, which is not)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
