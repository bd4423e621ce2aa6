"""Micro-benchmark of the wire codec: encode and decode time of the hot messages (a decode step's
TokenBatch, a detok pass's TextBatch) and of the others, in microseconds per message.

    .venv/bin/python -m lab.serving.protocol_codec

Numbers for a before/after comparison of a codec change, best of several repeats so that a busy
machine disturbs them least.
"""

from __future__ import annotations

import timeit

from splitserve import protocol
from splitserve.engine.interface import SamplingParams
from splitserve.protocol import (
    PROTOCOL_VERSION,
    DecodeLoad,
    DetokParams,
    GenerateRequest,
    Heartbeat,
    HistogramSnapshot,
    OpenStream,
    Source,
    StopCriteria,
    TextBatch,
    TextDelta,
    TokenBatch,
    TransportCounters,
)


def token_batch(n: int) -> TokenBatch:
    return TokenBatch(
        Source.DECODE, 12345, [f"req-{i:032x}" for i in range(n)], [17 + i for i in range(n)],
        [(i * 7919) % 49152 for i in range(n)], [-0.25 - i / n for i in range(n)], [0] * n,
    )  # fmt: skip


def prefill_batch() -> TokenBatch:
    rid = "req-" + "a" * 32
    return TokenBatch(Source.PREFILL, 7, [rid], [0], [42], [-0.5], [0],
                      [OpenStream(rid, DetokParams(True, ["\n\n"], False, 0), True)])  # fmt: skip


def text_batch(n: int, tokens: int) -> TextBatch:
    return TextBatch([
        TextDelta(f"req-{i:032x}", " word" * tokens, list(range(i, i + tokens)),
                  [-0.5] * tokens)
        for i in range(n)
    ])  # fmt: skip


def generate_request(prompt: int) -> GenerateRequest:
    return GenerateRequest(
        "req-" + "b" * 32, 1, [(i * 31) % 49152 for i in range(prompt)],
        SamplingParams(0.7, 0.9, 40, 123456789), StopCriteria(256, 0, False, [2], []),
        DetokParams(True, ["</s>"], False, 0), False,
    )  # fmt: skip


def heartbeat() -> Heartbeat:
    hist = HistogramSnapshot([0.001 * 2**i for i in range(12)], [3] * 13, 1.5, 39, 0.01, 0.02,
                             0.05)  # fmt: skip
    load = DecodeLoad(16, 4, 12, 0, 100000, 100000, 1600000, 3, 0, hist, hist)
    return Heartbeat("decode", 0, 4242, PROTOCOL_VERSION, 0.003, False,
                     TransportCounters(1, 2, 3, 4), decode=load, incarnation="a" * 32)  # fmt: skip


MESSAGES = {
    "TokenBatch decode x16": token_batch(16),
    "TokenBatch decode x256": token_batch(256),
    "TokenBatch prefill (opens)": prefill_batch(),
    "TextBatch 16 deltas x1 token": text_batch(16, 1),
    "TextBatch 64 deltas x4 tokens": text_batch(64, 4),
    "GenerateRequest 128 tokens": generate_request(128),
    "GenerateRequest 2048 tokens": generate_request(2048),
    "Heartbeat decode": heartbeat(),
}


def best_us(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def main() -> None:
    print(f"{'message':32} {'encode us':>10} {'decode us':>10}")
    for name, msg in MESSAGES.items():
        frames = [bytes(f) for f in protocol.encode(msg)]
        back, _ = protocol.decode(frames)
        assert back == msg, name
        number = 2000 if "2048" not in name and "256" not in name else 300
        enc = best_us(lambda m=msg: protocol.encode(m), number)
        dec = best_us(lambda f=frames: protocol.decode(f), number)
        print(f"{name:32} {enc:10.2f} {dec:10.2f}")


if __name__ == "__main__":
    main()
