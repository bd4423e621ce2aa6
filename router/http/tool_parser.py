"""Tool calls out of a model's text (the Hermes format of tools.py), whole or as it streams.

ToolCallStream takes a choice's text deltas and says what the client gets: content text (with
anything that could still become "<tool_call>" held back), a call's opening (index, id, name)
as soon as its name is known, and its arguments' JSON text in fragments as they come, as
OpenAI streams `delta.tool_calls`. Arguments are streamed only when the block writes the name
first (`{"name": ..., "arguments": ...}`, which the grammar of a required call does); otherwise
the call is sent whole when its block closes. A block that is not a call after all (not JSON,
or no name) is passed on as content, so no text is lost.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from router.http.tools import CALL_CLOSE, CALL_OPEN

_NAME_FIRST = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)


_BLOCK = re.compile(re.escape(CALL_OPEN) + "(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


@dataclass
class Call:
    index: int
    id: str
    name: str = ""
    arguments: str = ""  # JSON text


@dataclass
class Event:
    """One thing to tell the client: content text, or a part of call `index` (its opening when
    name is set, else an arguments fragment)."""

    content: str = ""
    index: int = -1
    id: str = ""
    name: str = ""
    arguments: str = ""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass
class ToolCallStream:
    calls: list[Call] = field(default_factory=list)
    _text: str = ""  # held back: maybe the start of an opening tag
    _block: str | None = None  # inside a block: its text so far
    _streaming: Call | None = None  # the call whose arguments are being streamed
    _sent: int = 0  # characters of the block's arguments already streamed
    _content_seen: bool = False

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._text += text
        while self._text:
            if self._block is None:
                start = self._text.find(CALL_OPEN)
                if start < 0:
                    keep = _partial_suffix(self._text, CALL_OPEN)
                    self._emit_content(events, self._text[: len(self._text) - keep])
                    self._text = self._text[len(self._text) - keep :]
                    break
                self._emit_content(events, self._text[:start])
                self._text = self._text[start + len(CALL_OPEN) :]
                self._block = ""
                continue
            end = self._text.find(CALL_CLOSE)
            if end < 0:
                keep = _partial_suffix(self._text, CALL_CLOSE)
                self._block += self._text[: len(self._text) - keep]
                self._text = self._text[len(self._text) - keep :]
                self._stream_arguments(events)
                break
            self._block += self._text[:end]
            self._text = self._text[end + len(CALL_CLOSE) :]
            self._close_block(events)
        return events

    def finish(self) -> list[Event]:
        """The text ended: what was held back goes out (an unclosed block is closed)."""
        events: list[Event] = []
        if self._block is not None:
            self._block += self._text
            self._text = ""
            self._close_block(events, closed=False)
        self._emit_content(events, self._text)
        self._text = ""
        return events

    # ---- inside a block ----
    def _stream_arguments(self, events: list[Event]) -> None:
        """Open the call once its name is known; stream its arguments object as it grows."""
        block = self._block or ""
        if self._streaming is None:
            match = _NAME_FIRST.match(block)
            if match is None:
                return
            try:
                name = json.loads(f'"{match.group(1)}"')
            except json.JSONDecodeError:
                return
            self._streaming = Call(len(self.calls), new_call_id(), name)
            self._arguments_at = match.end()
            self._sent = 0
            events.append(Event(index=self._streaming.index, id=self._streaming.id, name=name))
        body = block[self._arguments_at :].lstrip()
        if not body.startswith("{"):  # not an object (yet, or at all): sent whole at the close
            return
        end = _json_value_end(body)
        ready = body[: end if end is not None else len(body.rstrip())]
        if len(ready) > self._sent:
            events.append(Event(index=self._streaming.index, arguments=ready[self._sent :]))
            self._streaming.arguments += ready[self._sent :]
            self._sent = len(ready)

    def _close_block(self, events: list[Event], closed: bool = True) -> None:
        self._stream_arguments(events)
        call, self._streaming = self._streaming, None
        block, self._block = self._block or "", None
        parsed = _parse_call(block)
        if call is None and parsed is None:  # not a call: its text is content
            tail = CALL_CLOSE if closed else ""
            self._emit_content(events, f"{CALL_OPEN}{block}{tail}")
            return
        if call is None:
            call = Call(len(self.calls), new_call_id(), parsed[0])
            events.append(Event(index=call.index, id=call.id, name=call.name))
        if not call.arguments and parsed is not None:  # nothing streamed: all of it now
            call.arguments = parsed[1]
            events.append(Event(index=call.index, arguments=call.arguments))
        self.calls.append(call)

    def _emit_content(self, events: list[Event], text: str) -> None:
        if not text:
            return
        if self.calls or self._block is not None:  # between and after calls: only whitespace
            text = text if text.strip() else ""
        if text:
            events.append(Event(content=text))


def parse_calls(text: str) -> tuple[str, list[Call]]:
    """(content, calls) of a whole output: each closed block that is a call; the rest (a block
    cut off by max_tokens included) is content. As streamed, a call's arguments are its JSON as
    written when the name comes first, else re-encoded."""
    content, calls, at = [], [], 0
    for block in _BLOCK.finditer(text):
        parsed = _parse_call(block.group(1))
        if parsed is None:
            continue
        _add_content(content, text[at : block.start()], after_call=bool(calls))
        at = block.end()
        match = _NAME_FIRST.match(block.group(1))
        arguments = parsed[1]
        if match is not None:
            written = block.group(1)[match.end() :].lstrip()
            end = _json_value_end(written) if written.startswith("{") else None
            if end is not None:
                arguments = written[:end]
        calls.append(Call(len(calls), new_call_id(), parsed[0], arguments))
    _add_content(content, text[at:], after_call=bool(calls))
    return "".join(content), calls


def _add_content(content: list[str], text: str, after_call: bool) -> None:
    """As the stream does: whitespace between and after calls is no content."""
    if text and (text.strip() or not after_call):
        content.append(text)


def _parse_call(block: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a block, or None when it is not a call."""
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as JSON text
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _json_value_end(text: str) -> int | None:
    """Where the JSON object or array at the start of text ends (exclusive), if it has."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None
