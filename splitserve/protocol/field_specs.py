"""What each field of each message may hold (FIELD_SPECS, checked for every field as it is
decoded) and the checks across the fields of one message (MESSAGE_CHECKS): a message that decodes
is one its handler can rely on."""

from __future__ import annotations

from typing import Any

from splitserve.protocol.loads import HistogramSnapshot, PrefillLoad
from splitserve.protocol.messages import (
    Abort,
    DetokPool,
    Finish,
    FinishReason,
    GenerateRequest,
    Heartbeat,
    OpenStream,
    PrefixHeader,
    PromptScores,
    Ready,
    Repin,
    RequestFailed,
    ResumeStream,
    TextDelta,
    TokenBatch,
    TokenFinish,
)
from splitserve.protocol.params import MAX_TOP_LOGPROBS, PARAM_CHECKS, PARAM_SPECS
from splitserve.protocol.wire_checks import (
    INT32_MAX,
    TOKEN,
    Choice,
    Float,
    Int,
    Items,
    Str,
    WireError,
    compile_check,
)

# ---- what each field may hold --------------------------------------------------------------------
# Beyond its type (checked for every field, list elements included; see wire_checks.py), where a
# handler relies on more. Ints are non-negative int64 unless said here; floats are finite. The
# request parameters' fields are params.py's (PARAM_SPECS, from the one table of their bounds).

MAX_KV_DIMS = 8
MAX_WIRE_DECODE_WORKERS = 4096  # decode workers a prefill worker's load report counts for
WORKER_ROLES = frozenset({"prefill", "decode", "detok"})

RID = Str(1)
RIDS = Items(RID)
TOKENS = Items(TOKEN)
LOGPROB = Float(neg_inf=True)  # -inf: of a token the model gave (almost) no mass
SECONDS = Float(lo=0.0)
ROLE = Str(choices=WORKER_ROLES)
INCARNATION_CHARS = 32  # 128 random bits in hex
INCARNATION = Str(INCARNATION_CHARS, INCARNATION_CHARS)
MAX_WIRE_GRAMMAR_CHARS = 1 << 20  # a serialized grammar (a client's: splitserve/grammar/specs.py)
MAX_WIRE_PROMPT = 1 << 22  # tokens of a prompt whose logprobs travel
# alternatives of one token: at most MAX_TOP_LOGPROBS ids, and as many logprobs
TOP_IDS = Items(compile_check(Items(TOKEN, 0, MAX_TOP_LOGPROBS), "top ids"))
TOP_LOGPROBS = Items(compile_check(Items(LOGPROB, 0, MAX_TOP_LOGPROBS), "top logprobs"))


def _kv_entry(v: Any) -> list[Any]:
    """One entry of PrefixHeader.kv_meta: [dtype name, shape]."""
    if type(v) is not list or len(v) != 2:
        raise WireError("PrefixHeader.kv_meta: each entry is [dtype, shape]")
    return [_KV_DTYPE(v[0]), _KV_SHAPE(v[1])]


_KV_DTYPE = compile_check(Str(1, 16), "PrefixHeader.kv_meta dtype")
_KV_SHAPE = compile_check(Items(TOKEN, 0, MAX_KV_DIMS), "PrefixHeader.kv_meta shape")

FIELD_SPECS: dict[type, dict[str, Any]] = {
    **PARAM_SPECS,
    PromptScores: {
        "logprobs": Items(LOGPROB, 0, MAX_WIRE_PROMPT),
        "ranks": Items(Int(1, INT32_MAX), 0, MAX_WIRE_PROMPT),
        "top_ids": TOP_IDS,
        "top_logprobs": TOP_LOGPROBS,
    },
    GenerateRequest: {
        "request_id": RID,
        "epoch": TOKEN,
        "decode_index": TOKEN,
        "detok_index": TOKEN,
        "prompt": Items(TOKEN, min_len=1),
        "start_seq": TOKEN,
        "grammar": Str(0, MAX_WIRE_GRAMMAR_CHARS),
    },
    PrefixHeader: {
        "request_id": RID,
        "epoch": TOKEN,
        "detok_index": TOKEN,
        "length": Int(1, INT32_MAX),
        "first_seq": TOKEN,
        "first_token": TOKEN,
        "first_logprob": LOGPROB,
        "kv_meta": Items(_kv_entry, min_len=1),
        "grammar": Str(0, MAX_WIRE_GRAMMAR_CHARS),
        "context": TOKENS,
        "first_top_ids": Items(TOKEN, 0, MAX_TOP_LOGPROBS),
        "first_top_logprobs": Items(LOGPROB, 0, MAX_TOP_LOGPROBS),
    },
    OpenStream: {
        "request_id": RID, "epoch": TOKEN, "decode_index": TOKEN, "cached_tokens": TOKEN,
    },
    TokenBatch: {
        "request_ids": RIDS,
        "epochs": TOKENS,
        "seqs": TOKENS,
        "tokens": TOKENS,
        "logprobs": Items(LOGPROB),
        "finishes": Items(Choice(frozenset(TokenFinish))),
        "top_ids": TOP_IDS,
        "top_logprobs": TOP_LOGPROBS,
    },
    TextDelta: {
        "request_id": RID,
        "epoch": TOKEN,
        "start_seq": TOKEN,
        "token_ids": TOKENS,
        "logprobs": Items(LOGPROB),
        # what a detok worker decides; ABORT and ERROR are the router's own
        "finish_reason": Choice(
            frozenset({FinishReason.NONE, FinishReason.STOP, FinishReason.LENGTH}), FinishReason
        ),
        "top_ids": TOP_IDS,
        "top_logprobs": TOP_LOGPROBS,
        "cached_tokens": TOKEN,
    },
    PrefillLoad: {
        "prefix_check": Int(-1, 1),
        "outbox": Items(TOKEN, 0, MAX_WIRE_DECODE_WORKERS),
    },
    Abort: {"request_ids": RIDS, "epochs": TOKENS},
    Finish: {"request_ids": RIDS, "epochs": TOKENS},
    RequestFailed: {"request_ids": RIDS, "epochs": TOKENS, "role": ROLE},
    ResumeStream: {
        "request_id": RID,
        "epoch": TOKEN,
        "decode_index": TOKEN,
        "token_ids": TOKENS,
        "text_chars": TOKEN,
    },
    Repin: {
        "request_ids": RIDS,
        "epochs": TOKENS,
        "detok_indices": TOKENS,
        "from_seqs": TOKENS,
    },
    DetokPool: {"endpoints": Items(Str(0, 512))},
    HistogramSnapshot: {
        "buckets": Items(Float(lo=0.0)),
        "sum": SECONDS,
        "p50": SECONDS,
        "p90": SECONDS,
        "p99": SECONDS,
    },
    Ready: {"role": ROLE, "index": TOKEN, "pid": TOKEN, "incarnation": INCARNATION},
    Heartbeat: {
        "role": ROLE, "index": TOKEN, "pid": TOKEN, "loop_age_s": SECONDS,
        "incarnation": INCARNATION,
    },  # fmt: skip
}


def _token_batch_columns(m: TokenBatch) -> None:
    _columns(m, "epochs", "seqs", "tokens", "logprobs", "finishes")
    _alternatives(m, len(m.request_ids))


def _alternatives(m: Any, n: int) -> None:
    """top_ids and top_logprobs: both empty, or one list per token, pairwise of one length."""
    if not m.top_ids and not m.top_logprobs:
        return
    if len(m.top_ids) != n or len(m.top_logprobs) != n:
        raise WireError(f"{type(m).__name__}: top logprobs, when given, are one list per token")
    if any(len(a) != len(b) for a, b in zip(m.top_ids, m.top_logprobs, strict=True)):
        raise WireError(f"{type(m).__name__}: top_ids and top_logprobs differ in length")


def _prefix_alternatives(m: PrefixHeader) -> None:
    if len(m.first_top_ids) != len(m.first_top_logprobs):
        raise WireError("PrefixHeader: first_top_ids and first_top_logprobs differ in length")
    if m.context and len(m.context) != m.length:
        raise WireError("PrefixHeader: context, when given, is the whole prompt")


def _prompt_scores(m: PromptScores) -> None:
    if len(m.ranks) != len(m.logprobs):
        raise WireError("PromptScores: one rank per logprob")
    _alternatives(m, len(m.logprobs))


def _columns(m: Any, *names: str) -> None:
    """The message's parallel lists (request_ids and these) are of one length."""
    n = len(m.request_ids)
    if any(len(getattr(m, name)) != n for name in names):
        raise WireError(f"{type(m).__name__}: its columns differ in length")


def _delta_logprobs(m: TextDelta) -> None:
    if m.logprobs and len(m.logprobs) != len(m.token_ids):
        raise WireError("TextDelta: logprobs, when given, are one per token")
    _alternatives(m, len(m.token_ids))


def _histogram_shape(m: HistogramSnapshot) -> None:
    if len(m.counts) != len(m.buckets) + 1:
        raise WireError("HistogramSnapshot: one count per bucket, then +Inf")
    if any(a >= b for a, b in zip(m.buckets, m.buckets[1:], strict=False)):
        raise WireError("HistogramSnapshot: buckets must increase")


def _heartbeat_load(m: Heartbeat) -> None:
    loads = {"prefill": m.prefill, "decode": m.decode, "detok": m.detok}
    if loads.pop(m.role) is None or any(load is not None for load in loads.values()):
        raise WireError(f"Heartbeat: a {m.role} worker reports its own load, and only that")


# checks across the fields of one message, after each field's own
MESSAGE_CHECKS = {
    TokenBatch: _token_batch_columns,
    Abort: lambda m: _columns(m, "epochs"),
    Finish: lambda m: _columns(m, "epochs"),
    RequestFailed: lambda m: _columns(m, "epochs"),
    Repin: lambda m: _columns(m, "epochs", "detok_indices", "from_seqs"),
    TextDelta: _delta_logprobs,
    **PARAM_CHECKS,
    PrefixHeader: _prefix_alternatives,
    PromptScores: _prompt_scores,
    HistogramSnapshot: _histogram_shape,
    Heartbeat: _heartbeat_load,
}
