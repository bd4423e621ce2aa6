"""The largest frame each receiver accepts (ZeroMQ's ZMQ_MAXMSGSIZE): a peer that sends a bigger
one is disconnected by ZeroMQ before any of it reaches the process, so that no sender can make a
receiver read, hold and decode hundreds of megabytes (three 300 MB frames kept the router's loop
busy long enough to declare its workers dead).

The limit applies to each frame of a message. The decode worker's largest frame is one KV array of
a prefix as long as the context, so its limit follows from the model; every other receiver gets
control messages only, whose size follows from the bounds of what they carry.
"""

from __future__ import annotations

from splitserve.config import ClusterConfig
from splitserve.grammar.specs import MAX_GRAMMAR_CHARS
from splitserve.protocol import MAX_WIRE_STOP_CHARS, MAX_WIRE_STOPS
from splitserve.protocol.params import MAX_TOP_LOGPROBS
from splitserve.transport import SEND_HWM

# Room for everything in a control message besides what grows with the context or the batch:
# ids, sampling and stop parameters, load reports. The stop strings of one request can reach
# MAX_WIRE_STOPS x MAX_WIRE_STOP_CHARS x 4 bytes of UTF-8 (1 MiB): a GenerateRequest's, or a
# TokenBatch's opening a stream.
CONTROL_BASE_BYTES = 1 << 20
BYTES_PER_CONTEXT_TOKEN = 9  # a token id in MessagePack (<= 5 bytes) and its float (<= 9) rounded
BYTES_PER_SLOT = 4096  # per decode slot: a TokenBatch row or a TextDelta (id, text, tokens)
HEADER_MARGIN_BYTES = 1 << 20  # the PrefixHeader frame beside the KV frames
# a prompt token's logprobs with their alternatives (echo, prompt_logprobs): its logprob and rank,
# and MAX_TOP_LOGPROBS ids and logprobs, as MessagePack writes them, rounded up
BYTES_PER_SCORED_TOKEN = 16 + MAX_TOP_LOGPROBS * 16
# a request's grammar (UTF-8: up to 4 bytes a character), its logit bias and bad words
LOGITS_CONTROLS_BYTES = 4 * MAX_GRAMMAR_CHARS + (64 << 10)


def stop_strings_bytes() -> int:
    return MAX_WIRE_STOPS * MAX_WIRE_STOP_CHARS * 4


def control_message_bytes(config: ClusterConfig) -> int:
    """The largest frame of a message to the router, the prefill worker or a detok worker:
    a request's stop strings and logits controls (its grammar), a prompt (or a stream's tokens)
    as long as the context, scored with alternatives, and a row per decode slot (its
    alternatives included), each with a generous margin."""
    model = config.model
    return (
        CONTROL_BASE_BYTES
        + stop_strings_bytes()
        + LOGITS_CONTROLS_BYTES
        + (2 * BYTES_PER_CONTEXT_TOKEN + BYTES_PER_SCORED_TOKEN) * model.max_seq_len
        + BYTES_PER_SLOT * config.most_slots
    )


def decode_message_bytes(config: ClusterConfig, kv_bytes_per_token: int) -> int:
    """The decode worker's limit: a prefix of the whole context in one frame (k and v together,
    whatever way an engine splits them into frames), plus its header."""
    prefix = kv_bytes_per_token * config.model.max_seq_len
    return prefix + HEADER_MARGIN_BYTES + control_message_bytes(config)


# What a prefill worker holds, at most, for one decode worker that does not take its prefixes
# (dead, stuck, or busy in a step while a burst comes): half in the socket's queue, half in the
# worker's outbox (prefill_worker/outbox.py). ZeroMQ counts a send queue in messages, and at the
# 100,000 of the control senders a dead decode worker of the default model (94 MB for a prefix as
# long as the context) would let the prefill worker queue terabytes; so the socket queues as many
# of the largest prefixes as its half holds, and what it does not take waits in the outbox,
# counted in bytes. While a decode worker's outbox is over its half, its requests wait unprefilled
# in the prefill queue: nothing is dropped for the server's own back-pressure.
PREFIX_QUEUE_BYTES = 1 << 30
PREFIX_OUTBOX_BYTES = PREFIX_QUEUE_BYTES // 2
MIN_PREFIX_HWM = 2  # a model whose largest prefix is over the socket's half still queues two


def prefix_send_hwm(config: ClusterConfig, kv_bytes_per_token: int) -> int:
    """The prefill worker's socket queue to each decode worker, in messages: as many of the
    largest prefixes (the whole context, and its header) as the socket's half of
    PREFIX_QUEUE_BYTES holds."""
    largest = kv_bytes_per_token * config.model.max_seq_len + HEADER_MARGIN_BYTES
    socket_bytes = PREFIX_QUEUE_BYTES - PREFIX_OUTBOX_BYTES
    return min(SEND_HWM, max(MIN_PREFIX_HWM, socket_bytes // largest))


def max_message_bytes(role: str, config: ClusterConfig, kv_bytes_per_token: int = 0) -> int:
    """The receiver's ZMQ_MAXMSGSIZE for a role ("router", "prefill", "decode", "detok");
    the decode worker's needs its engine's KV bytes per token (Engine.kv_bytes_per_token)."""
    if role == "decode":
        if kv_bytes_per_token <= 0:
            raise ValueError("the decode worker's limit needs the engine's KV bytes per token")
        return decode_message_bytes(config, kv_bytes_per_token)
    if role in ("router", "prefill", "detok"):
        return control_message_bytes(config)
    raise ValueError(f"no receiver for role {role!r}")
