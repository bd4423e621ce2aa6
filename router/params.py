"""Generation parameters: every request the core is given, checked against the one table of their
bounds (splitserve/protocol/params.py: LIMITS, which the HTTP schemas build their fields from, so
a bad value is a 400 naming the field before anything else runs) and against the model (its
vocabulary and context), then turned into the wire's types (request_message). Values the float32
sampler cannot honour are refused, or resolved to the value it runs exactly (see the floors of
temperature and top_p, and top_k beyond the vocabulary).

max_tokens beyond the room the context leaves is refused (400), as vLLM does, not clamped: a
client that asked for more than can be generated learns it at once instead of finding a
`length` finish it did not ask for. (An endpoint that is not given max_tokens asks for the room.)
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from router.requests import InvalidRequest, RequestParams
from splitserve import protocol
from splitserve.engine.capabilities import supports_controls
from splitserve.grammar.specs import MAX_GRAMMAR_CHARS
from splitserve.protocol import GenerateRequest
from splitserve.protocol.params import (
    LIMITS,
    MAX_SEED,
    NO_PROMPT_LOGPROBS,
    Bound,
    DetokParams,
    LogitsControls,
    SamplingParams,
    StopCriteria,
)

# the client's bound of each parameter that is one value (the others are lists: see below)
BOUNDS: dict[str, Bound] = {n: limit.client for n, limit in LIMITS.items() if limit.item is None}
STOP, STOP_TOKEN_IDS, LOGIT_BIAS, BAD_WORDS = (
    LIMITS[n] for n in ("stop", "stop_token_ids", "logit_bias", "bad_words")
)


def field_bounds(name: str) -> dict[str, float]:
    """Parameter `name`'s bound as the keywords of its pydantic Field (router/http/schemas.py)."""
    return BOUNDS[name].pydantic()


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
    stops, chars = STOP.client, STOP.item.client
    if len(p.stop) not in stops or any(len(s) not in chars for s in p.stop):
        raise InvalidRequest(
            f"at most {stops.hi} stop strings, each of {chars.lo}-{chars.hi} characters", "stop"
        )
    if not all(_is_text(s) for s in p.stop):
        raise InvalidRequest("stop strings must be valid Unicode (no lone surrogates)", "stop")
    if len(p.stop_token_ids) not in STOP_TOKEN_IDS.client or any(
        not 0 <= t < vocab_size for t in p.stop_token_ids
    ):
        raise InvalidRequest(
            f"at most {STOP_TOKEN_IDS.client.hi} stop_token_ids, each in [0, {vocab_size})",
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
    most, bias = LOGIT_BIAS.client.hi, LOGIT_BIAS.item.client
    if len(ids) not in LOGIT_BIAS.client or len(set(ids)) != len(ids):
        raise InvalidRequest(f"logit_bias: at most {most} distinct token ids", "logit_bias")
    if any(type(t) is not int or not 0 <= t < vocab_size for t in ids):
        raise InvalidRequest(f"logit_bias: token ids must be in [0, {vocab_size})", "logit_bias")
    if any(b not in bias for _, b in p.logit_bias):
        raise InvalidRequest(f"logit_bias: each bias must be {bias.describe()}", "logit_bias")
    words = BAD_WORDS.item.client
    if len(p.bad_words) not in BAD_WORDS.client or any(
        len(w) not in words or not all(0 <= t < vocab_size for t in w) for w in p.bad_words
    ):
        raise InvalidRequest(
            f"bad_words: at most {BAD_WORDS.client.hi} token sequences (a word counts once with"
            f" and once without a leading space) of {words.lo}-{words.hi} tokens", "bad_words",
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


def check_engine(p: RequestParams, engine: str) -> None:
    """Refuse what the configured engine cannot do (InvalidRequest)."""
    if (p.grammar or logits_controls(p) is not None) and not supports_controls(engine):
        raise InvalidRequest(
            f"the {engine} engine does not apply grammars, penalties, logit_bias, min_p,"
            " bad_words, top_logprobs or prompt logprobs yet", code="unsupported_by_engine",
        )  # fmt: skip


def request_message(
    rid: str, prompt: list[int], p: RequestParams, eos_ids: list[int], incarnation: int
) -> GenerateRequest:
    """The request's GenerateRequest, not yet placed (its workers are stamped at admission);
    InvalidRequest if it cannot travel. The decode is the prefill worker's own check: a message
    it would drop as malformed must be refused here, not left waiting for a first token."""
    seed = p.seed if p.seed is not None else secrets.randbelow(MAX_SEED)
    msg = GenerateRequest(
        rid,
        0,  # epoch, decode and detok workers: stamped at admission (RouterCore._stamp)
        0,
        0,
        list(prompt),
        0,
        SamplingParams(p.temperature, p.top_p, p.top_k, seed),
        StopCriteria(p.max_tokens, p.min_tokens, p.ignore_eos, eos_ids, list(p.stop_token_ids)),
        DetokParams(p.skip_special_tokens, list(p.stop), p.include_stop_str_in_output,
                    p.min_tokens),
        p.logprobs,
        logits_controls(p),
        p.grammar,
        router_incarnation=incarnation,
    )  # fmt: skip
    try:
        protocol.decode(protocol.encode(msg))
    except (protocol.ProtocolError, TypeError, ValueError, OverflowError) as exc:
        # UnicodeEncodeError is a ValueError; msgpack raises OverflowError for huge ints
        raise InvalidRequest(f"the request cannot be sent to the workers: {exc}") from None
    return msg


def _is_text(s: str) -> bool:
    """Encodable as UTF-8 (a str from JSON may hold a lone surrogate, which is not)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
