"""A fake engine with hand-checkable arithmetic and no model, for pipeline tests and overhead.

prefill: first token = (2 * sum(prompt)) mod vocab ("weight 2").
generate: token at output position i = (4 * previous + i) mod vocab ("weight 4").
A resumed prefill (out_pos n > 0: the prompt ends with the request's first n output tokens) samples
as generate would have: (4 * prompt[-1] + n) mod vocab, so a resumed stream equals an undisturbed
one.
logprob of token t is -(t mod 10) / 10.

The "KV cache" is the prompt itself as float32 [length, 1]; insert() recomputes the first token
from it, so a KV cache mangled on the wire fails loudly instead of passing unnoticed.
Optional sleeps stand in for device compute (they release the GIL, as a device wait would).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from splitserve.engine.interface import Engine, Prefix, SamplingParams, StepOutput


def fake_first_token(prompt: Sequence[int], vocab_size: int) -> int:
    return (2 * sum(prompt)) % vocab_size


def fake_next_token(previous: int, position: int, vocab_size: int) -> int:
    return (4 * previous + position) % vocab_size


def fake_prefill_token(prompt: Sequence[int], out_pos: int, vocab_size: int) -> int:
    """What a prefill samples at output position out_pos (see the module docstring)."""
    if out_pos == 0:
        return fake_first_token(prompt, vocab_size)
    return fake_next_token(int(prompt[-1]), out_pos, vocab_size)


def fake_logprob(token: int) -> float:
    return -(token % 10) / 10


class FakeEngine(Engine):
    def __init__(
        self,
        num_slots: int,
        max_seq_len: int,
        vocab_size: int,
        step_s: float = 0.0,
        prefill_s: float = 0.0,
    ):
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size
        self.step_s = step_s
        self.prefill_s = prefill_s
        self._last = np.zeros(num_slots, np.int64)  # previous token per slot
        self._position = np.zeros(num_slots, np.int64)  # next output position per slot
        self._live = np.zeros(num_slots, bool)

    def warmup(self, prefill: bool = True, decode: bool = True, progress=None) -> None:
        if prefill:
            self.prefill([1, 2, 3], SamplingParams())

    def prefill(self, tokens: Sequence[int], sampling: SamplingParams, out_pos: int = 0) -> Prefix:
        if not tokens:
            raise ValueError("empty prompt")
        if len(tokens) >= self.max_seq_len:
            raise ValueError(f"prompt of {len(tokens)} tokens exceeds max_seq_len")
        if self.prefill_s:
            time.sleep(self.prefill_s)
        first = fake_prefill_token(tokens, out_pos, self.vocab_size)
        kv = np.asarray(tokens, np.float32).reshape(len(tokens), 1)
        return Prefix(
            kv=[kv], length=len(tokens), first_token=first, first_logprob=fake_logprob(first),
            out_pos=out_pos,
        )  # fmt: skip

    def insert(self, prefix: Prefix, slot: int, sampling: SamplingParams) -> None:
        (kv,) = prefix.kv
        prompt = [int(x) for x in kv[:, 0]]
        if (
            len(prompt) != prefix.length
            or fake_prefill_token(prompt, prefix.out_pos, self.vocab_size) != prefix.first_token
        ):
            raise ValueError("KV cache does not match its first token: corrupted in transit")
        self._last[slot] = prefix.first_token
        self._position[slot] = prefix.out_pos + 1
        self._live[slot] = True

    def generate(self) -> StepOutput:
        if self.step_s:
            time.sleep(self.step_s)
        tokens = (4 * self._last + self._position) % self.vocab_size
        tokens = np.where(self._live, tokens, 0).astype(np.int32)
        self._last = np.where(self._live, tokens, self._last)
        self._position = self._position + self._live
        logprobs = -(tokens % 10).astype(np.float32) / 10
        return StepOutput(tokens=tokens, logprobs=logprobs)

    def free(self, slot: int) -> None:
        self._live[slot] = False
        self._last[slot] = 0
        self._position[slot] = 0
