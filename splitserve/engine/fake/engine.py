"""A fake engine with hand-checkable arithmetic and no model, for pipeline tests and overhead.

Which token (the formula's choice c):
- prefill: c = (2 * sum(prompt)) mod vocab ("weight 2");
- generate: c at output position i = (4 * previous + i) mod vocab ("weight 4");
- a resumed prefill (out_pos n > 0: the prompt ends with the request's first n output tokens)
  chooses as generate would have: (4 * prompt[-1] + n) mod vocab, so a resumed stream equals an
  undisturbed one.

Its "logits" around that choice, for every token v of the vocabulary V:

    z[v] = -s * d(v),   d(v) = ((v - c) * P) mod V,   s = (1 + c mod 10) / 10

with P = 7919 (or the next prime after it that does not divide V), so that d is a permutation of
0..V-1: c is the most likely token (d = 0), then c + P^-1, c + 2 P^-1, ... (mod V), a fixed
shuffle of the vocabulary (without it, the allowed tokens nearest to c would be the same few
for most c, and constrained output would repeat one token forever). The
engine interface's processing applies to z in its documented order (splitserve/engine/
interface.py): grammar mask, bad words (not applied when they would leave no token), logit bias,
repetition / frequency / presence penalties, temperature, min-p, top-k, top-p. The fake never
draws: its token is the argmax of the processed z, ties going to the smaller d (so under a
grammar mask alone it picks the allowed token of the smallest d).
Its logprobs are log_softmax of the processed z (temperature included, as the interface says);
top-k alternatives are the k largest, ties in the same order. A slot without any of that (no
controls, no mask, no top-k / top-p) gets c and its logprob in closed form, fake_logprob(c):
-log(sum over d < V of exp(-s' d)), s' = s / temperature (s when greedy).

Prompt logprobs (raw: no controls, no temperature): prompt[i] is scored against the logits of a
prefill of prompt[:i], c_i = (2 * sum(prompt[:i])) mod V.

The "KV cache" is the prompt itself as float32 [length, 1]; insert() recomputes the first token
from it, so a KV cache mangled on the wire fails loudly instead of passing unnoticed.
Optional sleeps stand in for device compute (they release the GIL, as a device wait would).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from splitserve.engine.interface import (
    Engine,
    LogitsControls,
    Prefix,
    PromptLogprobs,
    SamplingParams,
    StepMasks,
    StepOutput,
    TopLogprobs,
    unpack_mask,
)


def fake_first_token(prompt: Sequence[int], vocab_size: int) -> int:
    return (2 * sum(prompt)) % vocab_size


def fake_next_token(previous: int, position: int, vocab_size: int) -> int:
    return (4 * previous + position) % vocab_size


def fake_prefill_token(prompt: Sequence[int], out_pos: int, vocab_size: int) -> int:
    """What a prefill chooses at output position out_pos (see the module docstring)."""
    if out_pos == 0:
        return fake_first_token(prompt, vocab_size)
    return fake_next_token(int(prompt[-1]), out_pos, vocab_size)


def fake_slope(choice: int) -> float:
    return (1 + choice % 10) / 10


@lru_cache(maxsize=8)
def fake_stride(vocab_size: int) -> int:
    """P: 7919, or the next prime that does not divide the vocabulary size."""
    p = 7919
    while vocab_size % p == 0 or any(p % q == 0 for q in range(2, int(p**0.5) + 1)):
        p += 1
    return p


def fake_distance(choice: int, vocab_size: int) -> np.ndarray:
    """d [V] int64: each token's rank in the fake's order (0 for the choice itself)."""
    return ((np.arange(vocab_size) - choice) * fake_stride(vocab_size)) % vocab_size


def fake_order(choice: int, vocab_size: int) -> np.ndarray:
    """The tokens by d: order[j] has d = j."""
    step = pow(fake_stride(vocab_size), -1, vocab_size)
    return (choice + np.arange(vocab_size) * step) % vocab_size


def fake_logits(choice: int, vocab_size: int) -> np.ndarray:
    """z [V] float64 around the formula's choice (see the module docstring)."""
    return -fake_slope(choice) * fake_distance(choice, vocab_size)


def fake_logprob(token: int, vocab_size: int, temperature: float = 0.0) -> float:
    """The logprob of the formula's own choice when nothing else applies (closed form)."""
    s = fake_slope(token) / (temperature if temperature > 0 else 1.0)
    return -math.log(-math.expm1(-s * vocab_size) / -math.expm1(-s))


@dataclass
class _SlotState:
    """What the fake needs to process one slot's logits beyond its formula."""

    sampling: SamplingParams
    controls: LogitsControls | None
    seen: set[int] = field(default_factory=set)  # prompt and output tokens (repetition)
    counts: Counter = field(default_factory=Counter)  # output tokens (frequency, presence)
    output: list[int] = field(default_factory=list)  # output so far (bad words)

    @classmethod
    def of(cls, sampling, controls, context: Sequence[int], out_pos: int) -> _SlotState:
        state = cls(sampling, controls, set(int(t) for t in context))
        output = [int(t) for t in context[len(context) - out_pos :]] if out_pos else []
        for t in output:
            state.add(t)
        return state

    def add(self, token: int) -> None:
        self.seen.add(token)
        self.counts[token] += 1
        self.output.append(token)

    def plain(self) -> bool:
        """Nothing beyond the formula: the closed form serves."""
        sp = self.sampling
        hot = sp.temperature > 0
        return self.controls is None and not (hot and (sp.top_k > 0 or sp.top_p < 1.0))


def _process(z: np.ndarray, st: _SlotState, allowed: np.ndarray | None) -> np.ndarray:
    """The interface's steps 1-6 on one slot's z [V] (a copy)."""
    z = z.copy()
    if allowed is not None:
        z[~allowed] = -np.inf
    ctl, sp = st.controls, st.sampling
    if ctl is not None:
        banned = z.copy()
        for word in ctl.bad_words:
            head = word[:-1]
            if not head or st.output[len(st.output) - len(head) :] == list(head):
                banned[word[-1]] = -np.inf
        if np.isfinite(banned).any():
            z = banned
        if ctl.bias_ids:
            z[np.asarray(ctl.bias_ids)] += np.asarray(ctl.bias_values)
        if ctl.repetition_penalty != 1.0 and st.seen:
            ids = np.fromiter(st.seen, np.int64)
            r = ctl.repetition_penalty
            z[ids] = np.where(z[ids] > 0, z[ids] / r, z[ids] * r)
        if st.counts and (ctl.frequency_penalty or ctl.presence_penalty):
            ids = np.fromiter(st.counts.keys(), np.int64)
            n = np.fromiter(st.counts.values(), np.float64)
            z[ids] -= ctl.frequency_penalty * n + ctl.presence_penalty
    if sp.temperature <= 0:
        return z
    z = z / sp.temperature
    probs = np.exp(z - z.max())
    if ctl is not None and ctl.min_p > 0:
        z = np.where(probs >= ctl.min_p * probs.max(), z, -np.inf)
    if 0 < sp.top_k < z.size:
        kth = np.sort(z)[-sp.top_k]
        z = np.where(z >= kth, z, -np.inf)
    if sp.top_p < 1.0:
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        mass_before = np.cumsum(probs[order]) - probs[order]
        keep = np.zeros(z.size, bool)
        keep[order[mass_before < sp.top_p]] = True
        z = np.where(keep, z, -np.inf)
    return z


def _log_softmax(z: np.ndarray) -> np.ndarray:
    top = z.max()
    return z - (top + np.log(np.exp(z - top).sum()))


def _pick(z: np.ndarray, choice: int, k: int) -> tuple[int, float, np.ndarray, np.ndarray]:
    """(token, its logprob, top-k ids, top-k logprobs) of processed z; ties by d."""
    logp = _log_softmax(z)
    order = fake_order(choice, z.size)
    rolled = logp[order]
    token = int(order[int(np.argmax(rolled))])
    if not k:
        return token, float(logp[token]), np.zeros(0, np.int32), np.zeros(0, np.float32)
    top = order[np.argsort(-rolled, kind="stable")[:k]]
    return token, float(logp[token]), top.astype(np.int32), logp[top].astype(np.float32)


class FakeEngine(Engine):
    supports_controls = True
    supports_prefix_reuse = True  # its KV is the prompt itself: reuse is exact

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
        self._temperature = np.zeros(num_slots, np.float64)
        self._states: list[_SlotState | None] = [None] * num_slots  # slots beyond the formula

    def warmup(
        self, prefill: bool = True, decode: bool = True, progress=None, quiet=None
    ) -> None:
        if prefill:
            self.prefill([1, 2, 3], SamplingParams())

    def prefill(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        out_pos: int = 0,
        *,
        controls: LogitsControls | None = None,
        mask: np.ndarray | None = None,
    ) -> Prefix:
        if not tokens:
            raise ValueError("empty prompt")
        if len(tokens) >= self.max_seq_len:
            raise ValueError(f"prompt of {len(tokens)} tokens exceeds max_seq_len")
        if self.prefill_s:
            time.sleep(self.prefill_s)
        vocab = self.vocab_size
        choice = fake_prefill_token(tokens, out_pos, vocab)
        kv = np.asarray(tokens, np.float32).reshape(len(tokens), 1)
        prefix = Prefix(kv=[kv], length=len(tokens), first_token=choice, first_logprob=0.0,
                        out_pos=out_pos)  # fmt: skip
        state = _SlotState.of(sampling, controls, tokens, out_pos)
        if state.plain() and mask is None:
            prefix.first_logprob = fake_logprob(choice, vocab, sampling.temperature)
        else:
            allowed = unpack_mask(mask, vocab) if mask is not None else None
            z = _process(fake_logits(choice, vocab), state, allowed)
            k = controls.top_logprobs if controls is not None else 0
            token, lp, top_ids, top_lps = _pick(z, choice, k)
            prefix.first_token, prefix.first_logprob = token, lp
            if k:
                prefix.first_top = TopLogprobs(top_ids[None], top_lps[None])
        if controls is not None:
            if controls.needs_history:
                prefix.context = np.asarray(tokens, np.int32)
            if controls.prompt_logprobs >= 0 and out_pos == 0:
                prefix.prompt_logprobs = fake_prompt_logprobs(
                    tokens, vocab, controls.prompt_logprobs
                )
        return prefix

    def prefill_cached(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        cached_kv: list[np.ndarray],
        out_pos: int = 0,
        **options,
    ) -> Prefix:
        """The prompt's first m tokens come from cached_kv, which must be their own KV (the
        prompt itself): a cache that handed over another prompt's blocks fails loudly here
        rather than yielding a plausible token. The simulated compute is the uncached share."""
        (kv,) = cached_kv
        m = kv.shape[0]
        if not 0 < m < len(tokens) or kv.shape[1:] != (1,):
            raise ValueError(f"cached KV of {m} tokens for a prompt of {len(tokens)}")
        if not np.array_equal(kv[:, 0], np.asarray(tokens[:m], np.float32)):
            raise ValueError("cached KV is not this prompt's prefix")
        cached = [int(x) for x in kv[:, 0]]
        sleep, self.prefill_s = self.prefill_s, self.prefill_s * (len(tokens) - m) / len(tokens)
        try:  # the rest of the prompt after the cached tokens, decoded from the cache
            prefix = self.prefill([*cached, *tokens[m:]], sampling, out_pos, **options)
        finally:
            self.prefill_s = sleep
        prefix.cached_tokens = m
        return prefix

    def insert(
        self,
        prefix: Prefix,
        slot: int,
        sampling: SamplingParams,
        *,
        controls: LogitsControls | None = None,
    ) -> None:
        (kv,) = prefix.kv
        prompt = [int(x) for x in kv[:, 0]]
        if len(prompt) != prefix.length:
            raise ValueError("KV cache does not match its first token: corrupted in transit")
        if controls is None and fake_prefill_token(prompt, prefix.out_pos, self.vocab_size) != (
            prefix.first_token
        ):  # (with controls the first token may differ from the formula's choice)
            raise ValueError("KV cache does not match its first token: corrupted in transit")
        self._last[slot] = prefix.first_token
        self._position[slot] = prefix.out_pos + 1
        self._live[slot] = True
        self._temperature[slot] = sampling.temperature
        state = _SlotState.of(sampling, controls, prompt, prefix.out_pos)
        state.add(prefix.first_token)
        self._states[slot] = None if state.plain() else state

    def generate(self, *, masks: StepMasks | None = None) -> StepOutput:
        if self.step_s:
            time.sleep(self.step_s)  # the "model pass", which overlaps a mask being computed
        vocab = self.vocab_size
        live = self._live
        choices = np.where(live, (4 * self._last + self._position) % vocab, 0).astype(np.int32)
        tokens = choices.copy()
        slopes = (1 + choices % 10) / 10
        scaled = slopes / np.where(self._temperature > 0, self._temperature, 1.0)
        logprobs = -np.log(-np.expm1(-scaled * vocab) / -np.expm1(-scaled))
        masked = {}
        if masks is not None:
            bits = masks.wait()
            masked = {int(s): bits[i] for i, s in enumerate(masks.slots)}
        ks = [s.controls.top_logprobs if s is not None and s.controls else 0 for s in self._states]
        k = max((k for k, on in zip(ks, live, strict=True) if on), default=0)
        top = TopLogprobs(np.zeros((self.num_slots, k), np.int32),
                          np.zeros((self.num_slots, k), np.float32)) if k else None  # fmt: skip
        for slot in np.flatnonzero(live):
            state = self._states[slot]
            if state is None and slot not in masked:
                continue
            if state is None:
                state = _SlotState(SamplingParams(self._temperature[slot]), None)
            row = masked.get(int(slot))
            allowed = unpack_mask(row, vocab) if row is not None else None
            c = int(choices[slot])
            z = _process(fake_logits(c, vocab), state, allowed)
            tokens[slot], logprobs[slot], ids, lps = _pick(z, c, k)
            if top is not None:
                top.ids[slot], top.logprobs[slot] = ids, lps
        for slot in np.flatnonzero(live):
            state = self._states[slot]
            if state is not None:
                state.add(int(tokens[slot]))
        self._last = np.where(live, tokens, self._last)
        self._position = self._position + live
        return StepOutput(tokens=tokens, logprobs=logprobs.astype(np.float32), top=top)

    def kv_layout(self, length: int) -> list[tuple[np.dtype, tuple[int, ...]]]:
        return [(np.dtype(np.float32), (length, 1))]  # the prompt itself: 4 bytes a token

    def free(self, slot: int) -> None:
        self._live[slot] = False
        self._last[slot] = 0
        self._position[slot] = 0
        self._temperature[slot] = 0.0
        self._states[slot] = None


def fake_prompt_logprobs(tokens: Sequence[int], vocab: int, k: int) -> PromptLogprobs:
    """prompt[i] scored against a prefill of prompt[:i] (closed form, see the module docstring)."""
    n = len(tokens)
    lps = np.zeros(max(n - 1, 0), np.float32)
    ranks = np.zeros(max(n - 1, 0), np.int32)
    ids = np.zeros((max(n - 1, 0), k), np.int32)
    tops = np.zeros((max(n - 1, 0), k), np.float32)
    total = 0
    for i in range(1, n):
        total += int(tokens[i - 1])
        c = (2 * total) % vocab
        s = fake_slope(c)
        log_z = math.log(-math.expm1(-s * vocab) / -math.expm1(-s))
        d = int(fake_distance(c, vocab)[int(tokens[i])])
        lps[i - 1] = -s * d - log_z
        ranks[i - 1] = d + 1
        ids[i - 1] = fake_order(c, vocab)[:k]
        tops[i - 1] = -s * np.arange(k) - log_z
    return PromptLogprobs(lps, ranks, TopLogprobs(ids, tops) if k else None)
