"""One request's detokenization state inside a detok worker: order restoration, incremental text,
stop strings. Pure logic, no sockets, so that it can be tested token by token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from detok_worker.detokenize import IncrementalDetokenizer, StopStringMatcher
from splitserve.protocol import DetokParams, FinishReason, PromptScores, TextDelta, TokenFinish
from splitserve.tokenizers.base import TokenTable

MAX_OUT_OF_ORDER = 100_000  # a stream further ahead than this of its next token is broken


@dataclass
class Stream:
    request_id: str
    epoch: int  # the placement epoch this state serves; tokens of older epochs are dropped
    decode_index: int  # the decode worker to tell when a stop string ends the stream
    params: DetokParams
    logprobs: bool
    detokenizer: IncrementalDetokenizer
    matcher: StopStringMatcher | None
    next_seq: int = 0
    emitted_tokens: int = 0
    # seq -> (token, logprob, finish, alternatives or None)
    waiting: dict[int, tuple[int, float, int, Any]] = field(default_factory=dict)
    finish_reason: FinishReason = FinishReason.NONE
    stopped_by_string: bool = False  # the decode worker must then be told to free the slot
    prompt_logprobs: PromptScores | None = None  # passed on with the first delta
    cached_tokens: int = 0  # likewise: the prompt tokens the prefill found in its prefix cache
    router_incarnation: int = 0  # of the router that owns the request (protocol.RouterHello)

    @classmethod
    def open(
        cls,
        request_id: str,
        epoch: int,
        decode_index: int,
        params: DetokParams,
        logprobs: bool,
        table: TokenTable,
    ) -> Stream:
        matcher = (
            StopStringMatcher(list(params.stop), params.include_stop_str_in_output)
            if params.stop
            else None
        )
        detokenizer = IncrementalDetokenizer(table, params.skip_special_tokens)
        return cls(request_id, epoch, decode_index, params, logprobs, detokenizer, matcher)

    def replay(self, token_ids: list[int]) -> int:
        """Rebuild the state after token_ids (the tokens the client has had), emitting nothing:
        the detokenizer's pending bytes and the stop-string window come out as they were when
        those tokens were first emitted. Returns the length of the text they produced."""
        emitted = 0
        for seq, token in enumerate(token_ids, start=self.next_seq):
            if self.finish_reason:
                # a stop string ended the stream inside the tokens the client has had (the
                # client's tokens and text disagree): nothing after it is text, and the stream
                # takes no more tokens (advance would find none to move)
                break
            self.add(seq, token, 0.0, TokenFinish.NONE)
            emitted += len(self.advance().text)
        return emitted

    def add(self, seq: int, token: int, logprob: float, finish: int, top: Any = None) -> None:
        """Buffer one token (top: its alternatives, (ids, logprobs)); it is emitted once every
        earlier sequence number has been."""
        if seq < self.next_seq or seq - self.next_seq > MAX_OUT_OF_ORDER:
            raise ValueError(f"{self.request_id}: sequence {seq} outside the stream window")
        self.waiting[seq] = (token, logprob, finish, top)

    def advance(self) -> TextDelta | None:
        """Emit every token now in order; None when nothing moved."""
        if self.next_seq not in self.waiting:
            return None
        delta = TextDelta(self.request_id, self.epoch, self.next_seq, "", [], [])
        delta.prompt_logprobs, self.prompt_logprobs = self.prompt_logprobs, None
        delta.cached_tokens, self.cached_tokens = self.cached_tokens, 0
        pieces: list[str] = []
        while not self.finish_reason and self.next_seq in self.waiting:
            token, logprob, finish, top = self.waiting.pop(self.next_seq)
            self.next_seq += 1
            self.emitted_tokens += 1
            delta.token_ids.append(token)
            if self.logprobs:
                delta.logprobs.append(logprob)
                if top is not None:
                    if not delta.top_ids:  # the delta's first alternatives: earlier ones had none
                        delta.top_ids.extend([] for _ in range(len(delta.token_ids) - 1))
                        delta.top_logprobs.extend([] for _ in range(len(delta.token_ids) - 1))
                elif delta.top_ids:
                    top = ([], [])
                if top is not None:
                    delta.top_ids.append(top[0])
                    delta.top_logprobs.append(top[1])
            pieces.append(self._text_of(token, finish))
        delta.text = "".join(pieces)
        delta.finish_reason = self.finish_reason
        if self.finish_reason:
            self.waiting.clear()
        return delta

    def _text_of(self, token: int, finish: int) -> str:
        # the text a finishing eos / stop token id would add is not part of the output
        text = self.detokenizer.push(token) if finish != TokenFinish.STOP_TOKEN else ""
        if finish != TokenFinish.NONE:
            text += self.detokenizer.flush()
        if self.matcher is not None and self.emitted_tokens >= self.params.min_tokens:
            text, stopped = self.matcher.push(text)
            if stopped:
                self.finish_reason = FinishReason.STOP
                # a finishing token already freed its slot at the decode worker
                self.stopped_by_string = finish == TokenFinish.NONE
                return text
            if finish != TokenFinish.NONE:
                text += self.matcher.flush()
        if finish == TokenFinish.STOP_TOKEN:
            self.finish_reason = FinishReason.STOP
        elif finish == TokenFinish.LENGTH:
            self.finish_reason = FinishReason.LENGTH
        return text
