"""Tool calls out of model text: however the text is cut into deltas, the streamed events add
up to the same content and the same calls as the whole text parsed at once, and a call's
streamed argument fragments join into its arguments; text that is not a call is never lost."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from router.http.tool_parser import ToolCallStream, parse_calls
from router.http.tools import call_block

names = st.sampled_from(["get_weather", "add", "lookup_2"])
values = st.recursive(
    st.none() | st.booleans() | st.integers(-999, 999) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                               max_size=3),
    max_leaves=6,
)  # fmt: skip
arguments = st.dictionaries(st.text(max_size=5), values, max_size=3)
prose = st.text(alphabet=st.characters(blacklist_characters="<"), max_size=20)


@st.composite
def outputs(draw):
    """(text, content, calls): prose, then calls in the Hermes format (maybe several)."""
    content = draw(prose)
    calls = draw(st.lists(st.tuples(names, arguments), max_size=3))
    compact = draw(st.booleans())
    blocks = []
    for name, args in calls:
        sep = (",", ":") if compact else (", ", ": ")
        body = json.dumps({"name": name, "arguments": args}, separators=sep, ensure_ascii=False)
        blocks.append(f"<tool_call>\n{body}\n</tool_call>")
    return content + "\n".join(blocks), content, calls


def stream(text: str, cuts: list[int]):
    parser = ToolCallStream()
    events, at = [], 0
    for cut in sorted(set(c % (len(text) + 1) for c in cuts)) + [len(text)]:
        events += parser.feed(text[at:cut])
        at = cut
    return events + parser.finish(), parser.calls


@settings(max_examples=300, deadline=None)
@given(out=outputs(), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_streamed_calls_equal_the_whole_parse_however_the_text_is_cut(out, cuts):
    text, content, calls = out
    whole_content, whole_calls = parse_calls(text)
    assert whole_content.strip() == content.strip() or not calls and whole_content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole_calls] == calls
    events, streamed = stream(text, cuts)
    assert "".join(e.content for e in events) == whole_content
    fragments: dict[int, str] = {}
    for e in events:
        if e.index >= 0:
            if e.name:
                assert e.index not in fragments and e.id.startswith("call_")
                fragments[e.index] = ""
            else:
                fragments[e.index] += e.arguments
    assert [(c.name, json.loads(c.arguments)) for c in streamed] == calls
    assert [fragments[c.index] for c in streamed] == [c.arguments for c in streamed]


def test_arguments_stream_in_fragments_when_the_name_comes_first():
    text = call_block("get_weather", {"city": "Paris", "days": [1, 2]})
    events, calls = stream(text, list(range(0, len(text), 3)))
    args = [e.arguments for e in events if e.index == 0 and not e.name]
    assert len(args) > 3 and "".join(args) == calls[0].arguments


def test_a_block_that_is_not_a_call_is_kept_as_content():
    text = "see <tool_call>\nnot json\n</tool_call> and <tool_ca"
    assert parse_calls(text) == (text, [])
