"""A resumed stream's replay (detok_worker/stream.py) over tokens in which a stop string ends the
stream before their last: found by tests/test_worker_fuzz.py, where such a ResumeStream crashed
the detok worker (the replay asked for text after the stream had finished)."""

from __future__ import annotations

from detok_worker.stream import Stream
from splitserve.protocol import DetokParams, FinishReason
from splitserve.tokenizers.base import PER_BYTE_REPLACE, TokenTable

TABLE = TokenTable((b"a", b"b", b"c"), frozenset(), True, "first_token", {}, PER_BYTE_REPLACE)


def _stream(stop: list[str]) -> Stream:
    return Stream.open("r", 1, 0, DetokParams(stop=stop), False, TABLE)


def test_a_replay_stops_at_a_stop_string_inside_the_clients_tokens():
    stream = _stream(["b"])
    emitted = stream.replay([0, 1, 2, 0, 2])  # "a", then "b" stops it; three tokens after
    assert stream.finish_reason == FinishReason.STOP
    assert emitted == 1  # "a": the stop string is not in the output
    assert stream.next_seq == 2


def test_a_replay_without_a_stop_gives_all_the_text():
    stream = _stream(["x"])
    assert stream.replay([0, 1, 2, 0]) == 4
    assert stream.finish_reason == FinishReason.NONE
    assert stream.next_seq == 4
