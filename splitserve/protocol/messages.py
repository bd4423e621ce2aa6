"""The messages: every dataclass that crosses a process boundary, the enums inside them (finish
reasons, token sources) and the type codes of frame 0. A request's parameters inside them are
params.py's, the heartbeats' load reports loads.py's; what each field may hold is field_specs.py's;
how they become frames is codec.py's."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from splitserve.protocol.loads import (
    DecodeLoad,
    DetokLoad,
    HistogramSnapshot,
    PrefillLoad,
    TransportCounters,
)
from splitserve.protocol.params import DetokParams, LogitsControls, SamplingParams, StopCriteria

# 12: PrefillLoad.outbox, outbox_waited (prefixes waiting for a decode worker's socket);
# 11: RouterHello and each request's router_incarnation (a restarted router's requests are never
# matched to its predecessor's, whose orphans the workers end);
# 10: DecodeLoad.compiling (the k-step programs compiled after Ready);
# 9: PrefillLoad.batched_calls, DecodeLoad.chunks (the workers' batching);
# 8: PrefillLoad.prefix_compiling (the background compiles left);
# 7: send sequence numbers to prefill workers (GenerateRequest.seq, Fence, PrefillLoad.last_seq);
# 6: prefix cache (cached_tokens, PrefillLoad's prefix_*); 5: logits controls, grammars, top and
# prompt logprobs; 4: incarnations
PROTOCOL_VERSION = 12


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


# ---- carried inside messages (a request's parameters are params.py's) ----------------------------


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
    # the router's send sequence number (shared with Fence); the worker's load echoes the last
    # one it received, which tells the router that this request reached it (router/liveness.py)
    seq: int = 0
    # the incarnation of the router that owns the request (RouterHello): every worker ends the
    # requests of an older one, whose client connections died with it
    router_incarnation: int = 0


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
    router_incarnation: int = 0  # GenerateRequest's


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
    cached_tokens: int = 0  # prompt tokens the prefill took from its prefix cache
    router_incarnation: int = 0  # GenerateRequest's


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
    cached_tokens: int = 0  # on the delta of output position 0: OpenStream's


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
class Fence:
    """router -> prefill_worker: no work, only a send sequence number. Messages on one link
    arrive in order, so once the worker's load echoes this seq (PrefillLoad.last_seq), every
    GenerateRequest sent to it before the fence has arrived or was lost on the way."""

    seq: int


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
    router_incarnation: int = 0  # of the router that owns the request (RouterHello)


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
class RouterHello:
    """router -> every worker, at its start and every heartbeat interval: its incarnation, the
    time it started in microseconds (so a restarted router's is the larger; the router's clock
    must not step back across its restart by more than the restart takes). A worker that learns
    a larger incarnation ends every request of the smaller ones: their router died, and with it
    their clients' connections. A request message of a smaller incarnation than the worker
    knows is dropped."""

    incarnation: int


@dataclass
class RequestFailed:
    """any worker -> router: these requests cannot complete (the message says why)."""

    request_ids: list[str]
    epochs: list[int]
    role: str
    message: str


# ---- heartbeats (their load reports are loads.py's) -------------------------------------------


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
    13: Fence,
    14: RouterHello,
}
TYPE_CODES = {cls: code for code, cls in MESSAGE_TYPES.items()}

_NESTED = (
    SamplingParams, LogitsControls, StopCriteria, DetokParams, PromptScores, OpenStream,
    TextDelta, HistogramSnapshot, TransportCounters, PrefillLoad, DecodeLoad, DetokLoad,
    WorkerInfo,
)  # fmt: skip
