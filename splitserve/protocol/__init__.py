"""Wire protocol: every message that crosses a process boundary, and nothing else. This package:
messages.py (the messages), params.py (a request's parameters inside them, and the one table of
their bounds), loads.py (the load reports of the heartbeats), field_specs.py (what their fields
may hold, checked by wire_checks.py), codec.py (frames).

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

from splitserve.protocol.codec import (  # noqa: F401
    _CODECS,
    _check_for,
    _Codec,
    _default_spec,
    _optional_of,
    arrays_from_frames,
    decode,
    encode,
    kv_meta,
)
from splitserve.protocol.field_specs import (  # noqa: F401
    _KV_DTYPE,
    _KV_SHAPE,
    FIELD_SPECS,
    INCARNATION,
    INCARNATION_CHARS,
    LOGPROB,
    MAX_KV_DIMS,
    MAX_WIRE_GRAMMAR_CHARS,
    MAX_WIRE_PROMPT,
    MESSAGE_CHECKS,
    RID,
    RIDS,
    ROLE,
    SECONDS,
    TOKEN,
    TOKENS,
    TOP_IDS,
    TOP_LOGPROBS,
    WORKER_ROLES,
    _alternatives,
    _columns,
    _delta_logprobs,
    _heartbeat_load,
    _histogram_shape,
    _kv_entry,
    _prefix_alternatives,
    _prompt_scores,
    _token_batch_columns,
)
from splitserve.protocol.loads import (  # noqa: F401
    DecodeLoad,
    DetokLoad,
    HistogramSnapshot,
    PrefillLoad,
    TransportCounters,
)
from splitserve.protocol.messages import (  # noqa: F401
    _NESTED,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    TYPE_CODES,
    Abort,
    DetokPool,
    Fence,
    Finish,
    FinishReason,
    GenerateRequest,
    Heartbeat,
    OpenStream,
    PrefixHeader,
    PromptScores,
    ProtocolError,
    Ready,
    Repin,
    RequestFailed,
    ResumeStream,
    RouterHello,
    Source,
    TextBatch,
    TextDelta,
    TokenBatch,
    TokenFinish,
    WorkerInfo,
)
from splitserve.protocol.params import (  # noqa: F401
    FLOAT32_TINY,
    LIMITS,
    MAX_WIRE_STOP_CHARS,
    MAX_WIRE_STOPS,
    DetokParams,
    LogitsControls,
    SamplingParams,
    StopCriteria,
)
