"""Wire protocol: every message that crosses a process boundary, and nothing else.

A message is one or more ZeroMQ frames. Frame 0 is a one-byte type code followed by a MessagePack
array of the message's fields in declaration order (nested dataclasses as nested arrays). Large
arrays (the KV cache of a Prefix) follow as extra frames, sent without copies and read back with
np.frombuffer. No pickle anywhere: a frame that is not a known, well-formed message raises
ProtocolError, which receivers count and log and never die of.

PROTOCOL_VERSION is a field of Ready and of every Heartbeat: the router refuses workers of another
version. Load reports are typed messages of their own (one per role), nested in the heartbeat;
finish reasons and token sources are IntEnums, ints on the wire.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from splitserve.engine.interface import (
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_TOP_LOGPROBS,
    LogitsControls,
    SamplingParams,
)
from splitserve.wire_checks import (
    INT32_MAX,
    INT64_MAX,
    Bool,
    Choice,
    Float,
    Int,
    Items,
    Str,
    WireError,
    compile_check,
)

PROTOCOL_VERSION = 5  # 5: logits controls, grammars, top and prompt logprobs; 4: incarnations


class TokenFinish(enum.IntEnum):
    """Why a token ended its request, decided by prefill or decode (TokenBatch.finishes)."""

    NONE = 0
    STOP_TOKEN = 1  # eos or a stop token id: its text is not part of the output
    LENGTH = 2  # max_tokens or the context limit: the token's text is part of the output


class FinishReason(enum.IntEnum):
    """How a request ended. The API string is the member's name in lower case."""

    NONE = 0  # still running
    STOP = 1  # eos, a stop token id or a stop string
    LENGTH = 2  # max_tokens or the context limit
    ABORT = 3  # the client went away or cancelled
    ERROR = 4  # a worker could not complete it

    @property
    def api(self) -> str:
        return self.name.lower()


class Source(enum.IntEnum):
    """Which worker sent a TokenBatch."""

    PREFILL = 0
    DECODE = 1


class ProtocolError(ValueError):
    """A frame that is not a well-formed message of this protocol version: not a known type, not
    MessagePack, or a field of the wrong type or out of its range (FIELD_SPECS)."""


# ---- parameters carried inside messages -------------------------------------------------------


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


@dataclass
class PromptScores:
    """A prompt's logprobs, from the prefill worker to the router (echo, prompt_logprobs):
    logprobs[i] and ranks[i] are those of prompt token i + 1; top_ids / top_logprobs are empty,
    or one list of alternatives (best first) per scored token."""

    logprobs: list[float]
    ranks: list[int]
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)


# ---- messages -----------------------------------------------------------------------------------


# Every message about a request names its id and its placement epoch: the router bumps the epoch
# whenever it moves the request (a worker died), and a worker or the router drops a message whose
# epoch is older than the one it holds, so a frozen worker that wakes up cannot deliver duplicates.


@dataclass
class GenerateRequest:
    """router -> prefill_worker: a tokenized request, stamped with its decode and detok workers.

    start_seq is the output position of the token this prefill samples: 0 for a new request; n
    for one resumed after its decode worker died, whose prompt then ends with its n tokens so far
    (its stream is already open at the detok worker: the router sent ResumeStream)."""

    request_id: str
    epoch: int
    decode_index: int
    detok_index: int
    prompt: list[int]
    start_seq: int
    sampling: SamplingParams
    stop: StopCriteria
    detok: DetokParams
    logprobs: bool = False
    controls: LogitsControls | None = None  # None: no logits processing beyond sampling
    # the output's grammar, compiled by the router into llguidance's serialized form ("": none);
    # the prefill and decode workers each build its matcher from it (splitserve/grammar/)
    grammar: str = ""


@dataclass
class PrefixHeader:
    """prefill_worker -> decode_worker: a prompt's KV cache (extra frames) and its first token,
    sampled at output position first_seq."""

    request_id: str
    epoch: int
    detok_index: int
    length: int
    first_seq: int
    first_token: int
    first_logprob: float
    sampling: SamplingParams
    stop: StopCriteria
    kv_meta: list[list[Any]]  # per extra frame: [dtype name, shape]
    controls: LogitsControls | None = None
    grammar: str = ""
    # the prompt's token ids when the decode side needs the history (penalties, bad words, a
    # grammar to replay: its last first_seq tokens are the output so far); else empty
    context: list[int] = field(default_factory=list)
    first_top_ids: list[int] = field(default_factory=list)  # the first token's alternatives
    first_top_logprobs: list[float] = field(default_factory=list)


@dataclass
class OpenStream:
    """Inside a TokenBatch from prefill: opens a request's stream at its detok worker (which tells
    decode worker decode_index when a stop string ends it)."""

    request_id: str
    epoch: int
    decode_index: int
    detok: DetokParams
    logprobs: bool
    prompt_logprobs: PromptScores | None = None


@dataclass
class TokenBatch:
    """prefill_worker or decode_worker -> detok_worker: tokens of one step, parallel lists.

    The decode worker sends one per detok worker per step; seqs are output positions (0 = first).
    """

    source: Source
    step: int
    request_ids: list[str]
    epochs: list[int]
    seqs: list[int]
    tokens: list[int]
    logprobs: list[float]
    finishes: list[int]  # TokenFinish values
    opens: list[OpenStream] = field(default_factory=list)
    # empty when no token of the batch has alternatives; else one list per token (maybe empty)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)


@dataclass
class TextDelta:
    """Inside a TextBatch: new text of one request, with the tokens it came from (the first of
    them at output position start_seq)."""

    request_id: str
    epoch: int
    start_seq: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason = FinishReason.NONE  # NONE, STOP or LENGTH from a detok worker
    top_ids: list[list[int]] = field(default_factory=list)  # as TokenBatch's, per token_ids
    top_logprobs: list[list[float]] = field(default_factory=list)
    prompt_logprobs: PromptScores | None = None  # on the delta of output position 0


@dataclass
class TextBatch:
    """detok_worker -> router: text deltas of every request that moved, one message per pass."""

    deltas: list[TextDelta]


@dataclass
class Abort:
    """router -> prefill_worker, decode_worker, detok_worker: forget these requests, at these
    epochs and every earlier one."""

    request_ids: list[str]
    epochs: list[int]


@dataclass
class Finish:
    """detok_worker -> decode_worker: these requests (at these epochs) hit a stop string; free
    their slots."""

    request_ids: list[str]
    epochs: list[int]


@dataclass
class ResumeStream:
    """router -> detok_worker: take over (or restart) a request's stream at a new epoch. The
    worker replays token_ids (every token the client has had) through a fresh detokenizer and
    stop-string window, emits nothing of it (text_chars characters of text were sent already),
    and carries on from output position len(token_ids)."""

    request_id: str
    epoch: int
    decode_index: int
    detok: DetokParams
    logprobs: bool
    token_ids: list[int]
    text_chars: int


@dataclass
class Repin:
    """router -> decode_worker: these requests' streams moved to other detok workers (theirs
    died): from now on send their tokens there, at the new epoch, starting with every token from
    output position from_seq on that the decode worker already produced."""

    request_ids: list[str]
    epochs: list[int]
    detok_indices: list[int]
    from_seqs: list[int]


@dataclass
class DetokPool:
    """router -> prefill_worker, decode_worker: the detok workers' endpoints by index ("" where
    an index is not in the pool), when the pool grows or shrinks."""

    endpoints: list[str]


@dataclass
class RequestFailed:
    """any worker -> router: these requests cannot complete (the message says why)."""

    request_ids: list[str]
    epochs: list[int]
    role: str
    message: str


# ---- load reports, nested in heartbeats ---------------------------------------------------------


@dataclass
class HistogramSnapshot:
    """A worker's latency histogram: fixed buckets (seconds) the router can add up, plus exact
    quantiles over the worker's recent window."""

    buckets: list[float]
    counts: list[int]  # one per bucket, then +Inf
    sum: float
    count: int
    p50: float
    p90: float
    p99: float


@dataclass
class TransportCounters:
    """A worker's message counts: sends dropped by a slow or gone peer, frames malformed."""

    sent: int = 0
    dropped: int = 0
    received: int = 0
    malformed: int = 0


@dataclass
class PrefillLoad:
    """Inside a prefill worker's Heartbeat."""

    queue: int  # requests waiting for their prefill
    queued_tokens: int  # their prompt tokens
    prefills: int  # run since start
    kv_bytes_sent: int  # KV cache bytes sent to decode workers since start
    prefill_time: HistogramSnapshot


@dataclass
class DecodeLoad:
    """Inside a decode worker's Heartbeat."""

    num_slots: int
    free_slots: int
    live: int
    pending: int  # prefixes waiting for a slot
    steps: int
    batches_sent: int
    tokens_sent: int
    tombstones: int
    failed_inserts: int
    kv_tokens: int  # positions the live slots hold (prompt and output so far)
    kv_capacity: int  # positions every slot could hold: num_slots x max_seq_len
    kv_bytes_received: int  # KV cache bytes received from prefill workers since start
    step_time: HistogramSnapshot
    step_gap: HistogramSnapshot  # start-to-start time of consecutive busy steps
    insert_time: HistogramSnapshot  # a prefix into its slot (engine.insert)


@dataclass
class DetokLoad:
    """Inside a detok worker's Heartbeat."""

    streams: int
    early: int  # streams whose tokens came before their opening
    tombstones: int
    tokens: int
    batches_in: int
    batches_out: int
    broken_streams: int
    resumed: int  # streams taken over from another detok worker (or restarted) since start
    pass_time: HistogramSnapshot


@dataclass
class WorkerInfo:
    """Inside Ready: what the worker's warm-up settled (0 where the role has none)."""

    max_seq_len: int = 0
    vocab_size: int = 0
    num_slots: int = 0
    endpoint: str = ""  # where the worker's receiver is reached (its senders connect there)


@dataclass
class Ready:
    """worker -> router: warm-up is done; this worker serves protocol_version.

    incarnation: a random token of this run of the worker, repeated by each of its heartbeats.
    Only a Ready with a new one is a restart (a pid can repeat in a container, and a heartbeat
    with another pid may be anyone's); the router ignores heartbeats of another incarnation."""

    role: str
    index: int
    pid: int
    protocol_version: int
    info: WorkerInfo
    incarnation: str = ""  # a default, so that a worker of an older version is refused by name


@dataclass
class Heartbeat:
    """worker -> router: alive, with its role's load report (the other two are None)."""

    role: str
    index: int
    pid: int
    protocol_version: int
    loop_age_s: float  # since the worker's loop last completed a pass
    draining: bool
    transport: TransportCounters
    prefill: PrefillLoad | None = None
    decode: DecodeLoad | None = None
    detok: DetokLoad | None = None
    incarnation: str = ""  # its Ready's


MESSAGE_TYPES: dict[int, type] = {
    1: GenerateRequest,
    2: PrefixHeader,
    3: TokenBatch,
    4: TextBatch,
    5: Abort,
    6: Finish,
    7: RequestFailed,
    8: Ready,
    9: Heartbeat,
    10: ResumeStream,
    11: Repin,
    12: DetokPool,
}
TYPE_CODES = {cls: code for code, cls in MESSAGE_TYPES.items()}

_NESTED = (
    SamplingParams, LogitsControls, StopCriteria, DetokParams, PromptScores, OpenStream,
    TextDelta, HistogramSnapshot, TransportCounters, PrefillLoad, DecodeLoad, DetokLoad,
    WorkerInfo,
)  # fmt: skip


# ---- what each field may hold --------------------------------------------------------------------
# Beyond its type (checked for every field, list elements included; see splitserve/wire_checks.py),
# where a handler relies on more. Ints are non-negative int64 unless said here; floats are finite.

MAX_WIRE_STOPS = 64  # stop strings per request (the router allows 16)
MAX_WIRE_STOP_CHARS = 4096  # characters per stop string (the router allows 1,024)
MAX_KV_DIMS = 8
WORKER_ROLES = frozenset({"prefill", "decode", "detok"})
# top_p reaches the sampler as float32, on hardware that flushes subnormals to zero: below this
# (float32's smallest normal number) it would keep no token at all. The router raises smaller
# values to it (router/params.py), which is exact.
FLOAT32_TINY = 2.0**-126

RID = Str(1)
RIDS = Items(RID)
TOKEN = Int(0, INT32_MAX)  # engines index int32 arrays with token ids, positions and counts
TOKENS = Items(TOKEN)
LOGPROB = Float(neg_inf=True)  # -inf: of a token the model gave (almost) no mass
SECONDS = Float(lo=0.0)
ROLE = Str(choices=WORKER_ROLES)
INCARNATION_CHARS = 32  # 128 random bits in hex
INCARNATION = Str(INCARNATION_CHARS, INCARNATION_CHARS)
MAX_WIRE_GRAMMAR_CHARS = 1 << 20  # a serialized grammar (the router allows far less: limits)
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
    SamplingParams: {
        "temperature": Float(lo=0.0),
        "top_p": Float(FLOAT32_TINY, 1.0),
        "top_k": TOKEN,
        "seed": Int(0, INT64_MAX),
    },
    # the router's bounds (router/params.py) are these or tighter
    LogitsControls: {
        "presence_penalty": Float(-2.0, 2.0),
        "frequency_penalty": Float(-2.0, 2.0),
        "repetition_penalty": Float(FLOAT32_TINY, 2.0),
        "bias_ids": Items(TOKEN, 0, MAX_LOGIT_BIAS),
        "bias_values": Items(Float(-100.0, 100.0), 0, MAX_LOGIT_BIAS),
        "min_p": Float(0.0, 1.0),
        "bad_words": Items(
            compile_check(Items(TOKEN, 1, MAX_BAD_WORD_TOKENS), "LogitsControls.bad_words"),
            0, MAX_BAD_WORDS,
        ),
        "top_logprobs": Int(0, MAX_TOP_LOGPROBS),
        "prompt_logprobs": Int(-1, MAX_TOP_LOGPROBS),
    },
    PromptScores: {
        "logprobs": Items(LOGPROB, 0, MAX_WIRE_PROMPT),
        "ranks": Items(Int(1, INT32_MAX), 0, MAX_WIRE_PROMPT),
        "top_ids": TOP_IDS,
        "top_logprobs": TOP_LOGPROBS,
    },
    StopCriteria: {
        "max_tokens": Int(1, INT32_MAX),
        "min_tokens": TOKEN,
        "eos_ids": TOKENS,
        "stop_token_ids": TOKENS,
    },
    DetokParams: {
        "stop": Items(Str(1, MAX_WIRE_STOP_CHARS), 0, MAX_WIRE_STOPS),
        "min_tokens": TOKEN,
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
    OpenStream: {"request_id": RID, "epoch": TOKEN, "decode_index": TOKEN},
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


def _controls(m: LogitsControls) -> None:
    if len(m.bias_ids) != len(m.bias_values):
        raise WireError("LogitsControls: bias_ids and bias_values differ in length")
    if len(set(m.bias_ids)) != len(m.bias_ids):
        raise WireError("LogitsControls: bias_ids repeat")


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
    LogitsControls: _controls,
    PrefixHeader: _prefix_alternatives,
    PromptScores: _prompt_scores,
    HistogramSnapshot: _histogram_shape,
    Heartbeat: _heartbeat_load,
}


# ---- the codec -----------------------------------------------------------------------------------


class _Codec:
    """One dataclass's wire plan, built once: which fields hold nested messages, and the check of
    each arriving value. Plain fields (numbers, strings, lists of them) go to MessagePack as they
    are, which packs them in C: walking a 128-token prompt element by element in Python cost more
    than the rest of the message together."""

    def __init__(self, cls: type):
        self.cls = cls
        self.fields = dataclasses.fields(cls)
        self.names = [f.name for f in self.fields]
        self.required = sum(
            1
            for f in self.fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        self.checks: list[Any] = []  # compiled by link(), once every codec exists
        self.post = MESSAGE_CHECKS.get(cls)
        # (field index, the nested message class, "one" | "many" (a list) | "optional")
        self.nested: list[tuple[int, type, str]] = []
        hints = typing.get_type_hints(cls)
        self.hints = [hints[name] for name in self.names]
        for i, hint in enumerate(self.hints):
            if hint in _NESTED:
                self.nested.append((i, hint, "one"))
            elif typing.get_origin(hint) is list and typing.get_args(hint)[0] in _NESTED:
                self.nested.append((i, typing.get_args(hint)[0], "many"))
            elif _optional_of(hint) in _NESTED:
                self.nested.append((i, _optional_of(hint), "optional"))

    def link(self) -> None:
        specs = FIELD_SPECS.get(self.cls, {})
        unknown = set(specs) - set(self.names)
        assert not unknown, f"FIELD_SPECS names no field of {self.cls.__name__}: {unknown}"
        self.checks = [
            _check_for(hint, specs.get(name), f"{self.cls.__name__}.{name}")
            for name, hint in zip(self.names, self.hints, strict=True)
        ]

    def to_wire(self, obj: Any) -> list[Any]:
        values = [getattr(obj, name) for name in self.names]
        for i, cls, kind in self.nested:
            codec = _CODECS[cls]
            if kind == "many":
                values[i] = [codec.to_wire(x) for x in values[i]]
            elif values[i] is not None:
                values[i] = codec.to_wire(values[i])
        return values

    def from_wire(self, values: Any) -> Any:
        cls = self.cls
        if type(values) is not list:
            raise WireError(f"{cls.__name__}: expected an array, got {type(values).__name__}")
        if not self.required <= len(values) <= len(self.names):
            raise WireError(f"{cls.__name__}: {len(values)} fields, expected {len(self.names)}")
        msg = cls(*[check(v) for check, v in zip(self.checks, values, strict=False)])
        if self.post is not None:
            self.post(msg)
        return msg


def _optional_of(hint: Any) -> Any:
    """X for a hint `X | None`, else None."""
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def _check_for(hint: Any, spec: Any, where: str):
    """The check of one field's wire value: its spec (FIELD_SPECS) or its type's default."""
    inner = _optional_of(hint)
    if inner is not None:
        check_inner = _check_for(inner, spec, where)
        return lambda v: None if v is None else check_inner(v)
    if hint in _NESTED:
        assert spec is None, f"{where}: a nested message is checked by its own specs"
        return _CODECS[hint].from_wire
    if spec is None:
        spec = _default_spec(hint, where)
    elif typing.get_origin(hint) is list and isinstance(spec, Items) and spec.item is None:
        spec = dataclasses.replace(spec, item=_default_spec(typing.get_args(hint)[0], where))
    return compile_check(spec, where)


def _default_spec(hint: Any, where: str) -> Any:
    if hint is bool:
        return Bool()
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        return Choice(frozenset(hint), hint)
    if hint is int:
        return Int()
    if hint is float:
        return Float()
    if hint is str:
        return Str()
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if item in _NESTED:
            return Items(_CODECS[item].from_wire)
        return Items(_default_spec(item, where))
    # a field whose type has no check would let anything through: refuse it at import
    raise TypeError(f"{where}: no wire check for the type {hint!r}; give it a FIELD_SPECS entry")


_CODECS: dict[type, _Codec] = {cls: _Codec(cls) for cls in (*_NESTED, *MESSAGE_TYPES.values())}
for _codec in _CODECS.values():
    _codec.link()


def encode(msg: Any, arrays: list[np.ndarray] | None = None) -> list[Any]:
    """Message -> frames. Arrays become extra frames (memoryviews: no copy on send)."""
    cls = type(msg)
    body = msgpack.packb(_CODECS[cls].to_wire(msg), use_bin_type=True)
    frames: list[Any] = [bytes([TYPE_CODES[cls]]) + body]
    for a in arrays or ():
        frames.append(memoryview(np.ascontiguousarray(a)).cast("B"))
    return frames


def decode(frames: list[Any]) -> tuple[Any, list[Any]]:
    """Frames -> (message, extra frames). Raises ProtocolError on anything malformed: a message
    that decodes has every field of its type and within its range (FIELD_SPECS, MESSAGE_CHECKS),
    and extra frames only when it is a PrefixHeader, one per array it announces."""
    if not frames:
        raise ProtocolError("empty message")
    head = bytes(frames[0])
    if not head:
        raise ProtocolError("empty header frame")
    cls = MESSAGE_TYPES.get(head[0])
    if cls is None:
        raise ProtocolError(f"unknown message type {head[0]}")
    try:
        body = msgpack.unpackb(head[1:], raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable {cls.__name__} body: {exc}") from exc
    try:
        msg = _CODECS[cls].from_wire(body)
    except (TypeError, ValueError) as exc:  # WireError, and a wrong value a constructor refused
        raise ProtocolError(f"malformed {cls.__name__}: {exc}") from exc
    extra = list(frames[1:])
    announced = len(msg.kv_meta) if cls is PrefixHeader else 0
    if len(extra) != announced:
        raise ProtocolError(f"{cls.__name__} with {len(extra)} extra frames, {announced} announced")
    return msg, extra


def kv_meta(arrays: list[np.ndarray]) -> list[list[Any]]:
    return [[a.dtype.str, list(a.shape)] for a in arrays]


def arrays_from_frames(meta: list[list[Any]], frames: list[Any]) -> list[np.ndarray]:
    """Rebuild KV arrays as read-only views over the received frames (no copy)."""
    if len(meta) != len(frames):
        raise ProtocolError(f"{len(frames)} array frames, header announces {len(meta)}")
    arrays = []
    for (dtype, shape), frame in zip(meta, frames, strict=True):
        try:
            dt = np.dtype(dtype)
            if dt.kind not in "fiub":  # numbers only: never objects from the wire
                raise ProtocolError(f"array dtype {dtype} is not numeric")
            a = np.frombuffer(frame.buffer if hasattr(frame, "buffer") else frame, dt)
            arrays.append(a.reshape(shape))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad array frame {dtype} {shape}: {exc}") from exc
    return arrays
