"""An SSE event is one line for every client: text that holds characters some line splitters treat
as line breaks (NEL, LINE and PARAGRAPH SEPARATOR) is escaped, and the JSON still round-trips."""

import json

from httpx._decoders import LineDecoder
from hypothesis import given
from hypothesis import strategies as st

from router.http.streaming import sse


@given(st.text())
def test_event_is_one_line_and_round_trips(text):
    payload = {"choices": [{"text": text + "\x85\u2028\u2029\n\r東京🙂"}]}
    lines = [line for line in LineDecoder().decode(sse(payload).decode()) if line]
    assert len(lines) == 1 and lines[0].startswith("data: ")
    assert json.loads(lines[0][6:]) == payload
    assert sse(payload).decode().splitlines()[0] == lines[0]


@given(st.text())
def test_text_event_template_gives_the_same_event_as_a_whole_encoding(text):
    """The per-token fast path (a template with the text JSON-encoded into it) emits exactly the
    event that encoding the whole chunk would, for any text."""
    from router.http.streaming import TextEvents

    def chunk(t):
        return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m\u2028",
                "choices": [{"index": 0, "text": t, "logprobs": None, "finish_reason": None}]}

    events = TextEvents(lambda t: sse(chunk(t)))
    assert events.template is not None
    for t in (text, text + "\x85\u2028\u2029\n\r東京🙂\"\\", "\ue000"):
        assert events.event(t) == sse(chunk(t))
