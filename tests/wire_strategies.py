"""Hypothesis strategies for well-formed wire messages: every field of its type and within the
range protocol.FIELD_SPECS gives it. Shared by the round-trip test and the fuzzing test (which
starts from these and breaks them)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from splitserve import protocol
from splitserve.protocol import (
    Abort,
    DetokParams,
    Finish,
    GenerateRequest,
    Heartbeat,
    OpenStream,
    PrefixHeader,
    Ready,
    RequestFailed,
    StopCriteria,
    TextBatch,
    TextDelta,
    TokenBatch,
)
from splitserve.protocol.params import MAX_TOP_LOGPROBS, LogitsControls, SamplingParams

ids = st.text(min_size=1, max_size=40)
tokens = st.integers(0, 2**31 - 1)
token_lists = st.lists(tokens, max_size=300)
counts = st.integers(0, 2**40)
seconds = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
logprobs = st.floats(max_value=0.0, allow_nan=False, width=32) | st.just(-math.inf)
roles = st.sampled_from(sorted(protocol.WORKER_ROLES))
incarnations = st.text(min_size=protocol.INCARNATION_CHARS, max_size=protocol.INCARNATION_CHARS)

sampling = st.builds(
    SamplingParams,
    st.floats(min_value=0.0, allow_nan=False, allow_infinity=False, width=32),
    st.floats(min_value=protocol.FLOAT32_TINY, max_value=1.0, width=32),
    tokens,
    st.integers(0, 2**63 - 1),
)



@st.composite
def controls(draw):
    n = draw(st.integers(0, 5))
    bias_ids = draw(st.lists(tokens, min_size=n, max_size=n, unique=True))
    return LogitsControls(
        draw(st.floats(-2.0, 2.0, width=32)),
        draw(st.floats(-2.0, 2.0, width=32)),
        draw(st.floats(protocol.FLOAT32_TINY, 2.0, width=32)),
        bias_ids,
        draw(st.lists(st.floats(-100.0, 100.0, width=32), min_size=n, max_size=n)),
        draw(st.floats(0.0, 1.0, width=32)),
        draw(st.lists(st.lists(tokens, min_size=1, max_size=4), max_size=4)),
        draw(st.integers(0, MAX_TOP_LOGPROBS)),
        draw(st.integers(-1, MAX_TOP_LOGPROBS)),
    )


@st.composite
def alternatives(draw, n: int):
    """(top_ids, top_logprobs) for n tokens: both empty, or one pair of lists per token."""
    if not draw(st.booleans()):
        return [], []
    ks = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    top_ids = [draw(st.lists(tokens, min_size=k, max_size=k)) for k in ks]
    return top_ids, [draw(st.lists(logprobs, min_size=k, max_size=k)) for k in ks]


@st.composite
def prompt_scores(draw):
    n = draw(st.integers(0, 6))
    return protocol.PromptScores(draw(st.lists(logprobs, min_size=n, max_size=n)),
                                 draw(st.lists(st.integers(1, 2**31 - 1), min_size=n,
                                               max_size=n)),
                                 *draw(alternatives(n)))  # fmt: skip


grammars = st.just("") | st.text(max_size=40)
stops = st.builds(StopCriteria, st.integers(1, 2**31 - 1), tokens, st.booleans(), token_lists,
                  token_lists)  # fmt: skip
detoks = st.builds(DetokParams, st.booleans(), st.lists(st.text(min_size=1, max_size=8),
                   max_size=protocol.MAX_WIRE_STOPS), st.booleans(), tokens)  # fmt: skip
opens = st.builds(OpenStream, ids, tokens, tokens, detoks, st.booleans(),
                  st.none() | prompt_scores(), tokens, counts)  # fmt: skip
reasons = st.sampled_from([protocol.FinishReason.NONE, protocol.FinishReason.STOP,
                           protocol.FinishReason.LENGTH])  # fmt: skip


@st.composite
def deltas(draw):
    toks = draw(token_lists)
    lps = draw(st.just([]) | st.lists(logprobs, min_size=len(toks), max_size=len(toks)))
    return TextDelta(draw(ids), draw(tokens), draw(tokens), draw(st.text()), toks, lps,
                     draw(reasons), *draw(alternatives(len(toks))),
                     draw(st.none() | prompt_scores()), draw(tokens))  # fmt: skip


@st.composite
def histograms(draw):
    buckets = sorted(draw(st.lists(seconds, unique=True, max_size=4)))
    return protocol.HistogramSnapshot(
        buckets, draw(st.lists(counts, min_size=len(buckets) + 1, max_size=len(buckets) + 1)),
        draw(seconds), draw(counts), draw(seconds), draw(seconds), draw(seconds),
    )  # fmt: skip


transports = st.builds(protocol.TransportCounters, counts, counts, counts, counts)
prefill_loads = st.builds(protocol.PrefillLoad, counts, counts, counts, counts, histograms(),
                          *[counts] * 6, st.integers(-1, 1),
                          outbox=st.lists(tokens, max_size=4), outbox_waited=counts)  # fmt: skip
decode_loads = st.builds(protocol.DecodeLoad, *[counts] * 12, histograms(), histograms(),
                         histograms())  # fmt: skip
detok_loads = st.builds(protocol.DetokLoad, *[counts] * 8, histograms())
infos = st.builds(protocol.WorkerInfo, counts, counts, counts, st.text(max_size=40))


@st.composite
def heartbeats(draw):
    role = draw(roles)
    loads = {"prefill": prefill_loads, "decode": decode_loads, "detok": detok_loads}
    load = draw(loads[role])
    return Heartbeat(role, draw(tokens), draw(tokens), draw(counts), draw(seconds),
                     draw(st.booleans()), draw(transports), **{role: load},
                     incarnation=draw(incarnations))  # fmt: skip


@st.composite
def token_batches(draw):
    n = draw(st.integers(0, 70))
    column = lambda s: draw(st.lists(s, min_size=n, max_size=n))  # noqa: E731
    return TokenBatch(
        draw(st.sampled_from(list(protocol.Source))),
        draw(counts),
        column(ids),
        column(tokens),
        column(tokens),
        column(tokens),
        column(logprobs),
        column(st.sampled_from(list(protocol.TokenFinish))),
        draw(st.lists(opens, max_size=3)),
        *draw(alternatives(n)),
    )


@st.composite
def prefixes(draw):
    """(PrefixHeader, its KV arrays)."""
    length = draw(st.integers(1, 6))
    kv = [np.arange(length * 2, dtype=np.float32).reshape(length, 2) + i
          for i in range(draw(st.integers(1, 2)))]  # fmt: skip
    k = draw(st.integers(0, 3))
    header = PrefixHeader(draw(ids), draw(tokens), draw(tokens), length, draw(tokens),
                          draw(tokens), draw(logprobs), draw(sampling), draw(stops),
                          protocol.kv_meta(kv), draw(st.none() | controls()), draw(grammars),
                          draw(st.just([]) | st.lists(tokens, min_size=length, max_size=length)),
                          draw(st.lists(tokens, min_size=k, max_size=k)),
                          draw(st.lists(logprobs, min_size=k, max_size=k)),
                          draw(counts))  # fmt: skip
    return header, kv


no_arrays = lambda s: s.map(lambda m: (m, []))  # noqa: E731


@st.composite
def columns(draw, cls, width: int, *rest):
    """A message whose first `width` fields are parallel lists (ids, then ints), then `rest`."""
    n = draw(st.integers(0, 20))
    lists = [draw(st.lists(ids, min_size=n, max_size=n))]
    lists += [draw(st.lists(tokens, min_size=n, max_size=n)) for _ in range(width - 1)]
    return cls(*lists, *(draw(s) for s in rest))

# per message type: (message, the arrays that travel with it)
BY_TYPE = {
    GenerateRequest: no_arrays(st.builds(
        GenerateRequest, ids, tokens, tokens, tokens, st.lists(tokens, min_size=1, max_size=300),
        tokens, sampling, stops, detoks, st.booleans(), st.none() | controls(), grammars, counts,
        counts,
    )),
    PrefixHeader: prefixes(),
    TokenBatch: no_arrays(token_batches()),
    TextBatch: no_arrays(st.builds(TextBatch, st.lists(deltas(), max_size=10))),
    Abort: no_arrays(columns(Abort, 2)),
    protocol.Fence: no_arrays(st.builds(protocol.Fence, counts)),
    Finish: no_arrays(columns(Finish, 2)),
    RequestFailed: no_arrays(columns(RequestFailed, 2, roles, st.text())),
    protocol.ResumeStream: no_arrays(st.builds(
        protocol.ResumeStream, ids, tokens, tokens, detoks, st.booleans(), token_lists, tokens,
        counts,
    )),
    protocol.Repin: no_arrays(columns(protocol.Repin, 4)),
    protocol.RouterHello: no_arrays(st.builds(protocol.RouterHello, counts)),
    protocol.DetokPool: no_arrays(
        st.builds(protocol.DetokPool, st.lists(st.text(max_size=60), max_size=8))
    ),
    Ready: no_arrays(st.builds(Ready, roles, tokens, tokens, counts, infos, incarnations)),
    Heartbeat: no_arrays(heartbeats()),
}  # fmt: skip
messages = st.one_of(*BY_TYPE.values())
