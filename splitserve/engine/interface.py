"""The engine interface that the prefill and decode workers drive (JetStream-like).

An engine knows nothing of sockets or processes; a worker knows nothing of model math.
The arrays of a Prefix are exactly what travels from the prefill worker to the decode worker,
so they are kept compact: the prompt's true length only, in the cache's own dtype.

Per-request logits processing is part of the contract. A request may carry LogitsControls
(penalties, logit bias, min-p, bad words, top logprobs, prompt logprobs) and, per step, a
grammar mask (StepMasks). An engine applies them to each slot's logits inside its
compiled step, in one fixed order (the order of vLLM v1's sampler):

  1. grammar mask: tokens outside the slot's allowed set get -inf
  2. bad words: the last token of each bad word whose other tokens end the output gets -inf
  3. logit bias: logits[id] += value
  4. penalties: repetition (over prompt and output tokens: a positive logit is divided by it,
     a negative one multiplied), then frequency (minus penalty x the token's count in the output)
     and presence (minus penalty once the token is in the output)
  5. temperature (not for greedy slots)
  6. min-p, top-k, top-p: tokens below the thresholds get -inf (not for greedy slots)
  7. the token: argmax (greedy) or the seeded draw from the result.

The logprobs returned (the sampled token's, and its top-k alternatives) are log_softmax of the
logits after steps 1-6: the distribution the token was drawn from (vLLM's "processed_logprobs";
for a greedy slot, after steps 1-4, as vLLM does). A batch in which no live slot has controls
or a mask must run exactly the path it ran before these existed: nothing is paid for them.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

# a request's parameters are the wire's types: the protocol package is their home
from splitserve.protocol.params import (  # noqa: F401
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_TOP_LOGPROBS,
    LogitsControls,
    SamplingParams,
)


@dataclass
class TopLogprobs:
    """The most likely tokens of the distributions some tokens were drawn from, best first."""

    ids: np.ndarray  # [n, k] int32
    logprobs: np.ndarray  # [n, k] float32


@dataclass
class PromptLogprobs:
    """log P(prompt[i] | prompt[:i]) for i = 1..n-1 (the first token has none), with top-k."""

    logprobs: np.ndarray  # [n - 1] float32
    ranks: np.ndarray  # [n - 1] int32: 1 + how many tokens were more likely than prompt[i]
    top: TopLogprobs | None  # [n - 1, k], when k > 0 was asked for


@dataclass
class StepMasks:
    """The allowed tokens of a step's constrained slots (every other slot is unconstrained).

    bits uses llguidance's layout: word w of a row holds tokens 32w .. 32w+31, token 32w+j allowed
    when bit j is set; W = ceil(vocab_size / 32). The worker may still be computing it (a Future):
    an engine first dispatches the step's model pass, then waits for the mask, so that mask and
    model overlap. Every row allows at least one token.
    """

    slots: np.ndarray  # [m] int32, ascending
    bits: np.ndarray | Future  # [m, W] int32

    def wait(self) -> np.ndarray:
        """The [m, W] mask, once it is computed."""
        bits = self.bits
        return bits.result() if isinstance(bits, Future) else bits


def unpack_mask(row: np.ndarray, vocab_size: int) -> np.ndarray:
    """One packed row [W] int32 -> allowed [vocab_size] bool."""
    bits = np.unpackbits(np.ascontiguousarray(row).view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


@dataclass
class Prefix:
    """A prompt's KV cache (true length) and the first sampled token (output position 0)."""

    # engine-defined arrays, e.g. k and v each [layers, length, kv_heads, head_dim]
    kv: list[np.ndarray]
    length: int  # prompt tokens covered by kv
    first_token: int
    first_logprob: float
    # the output position first_token was sampled at: 0, or n for a request resumed after its
    # n output tokens (which then end its prompt)
    out_pos: int = 0
    first_top: TopLogprobs | None = None  # [1, k] when controls asked for top logprobs
    prompt_logprobs: PromptLogprobs | None = None  # when controls asked for them
    # the prompt's token ids, when controls need the history (LogitsControls.needs_history);
    # its last out_pos tokens are the request's output so far
    context: np.ndarray | None = None  # [length] int32
    # prompt tokens whose KV prefill_cached took as given rather than computed (0 when it
    # computed them all: prefill(), or a prefill_cached that could not reuse them)
    cached_tokens: int = 0


@dataclass
class StepOutput:
    """Decode output: a token and its log-probability per slot (free slots hold junk);
    [slots] for one step, [steps, slots] from generate_many."""

    tokens: np.ndarray  # [slots] or [steps, slots] int32
    logprobs: np.ndarray  # [slots] or [steps, slots] float32
    # when some live slot asked for top logprobs: [slots, k], k at least the largest count asked
    # (each slot reads as many as it asked for); one step only
    top: TopLogprobs | None = None


class Engine(abc.ABC):
    """prefill -> insert into a slot -> generate steps -> free."""

    num_slots: int  # decode batch size
    max_seq_len: int  # prompt + output tokens one slot can hold
    vocab_size: int
    # whether prefill/insert/generate take LogitsControls and StepMasks; a worker whose engine
    # does not refuses requests that need them
    supports_controls: bool = False

    @abc.abstractmethod
    def warmup(
        self, prefill: bool = True, decode: bool = True, progress=None, quiet=None
    ) -> None:
        """Compile every shape this engine will run: the prefill buckets (a prefill worker's
        side) and the decode steps (a decode worker's side). progress(key, done, total,
        seconds, source), when given, is told of each program as it is ready (for the start-up
        log; source says whether it was loaded or compiled). quiet(), when given, says whether
        the worker is idle: programs an engine may compile after warm-up wait for it."""

    @abc.abstractmethod
    def prefill(self, tokens: Sequence[int], sampling: SamplingParams, out_pos: int = 0) -> Prefix:
        """Run the prompt; sample output position out_pos (0, unless the request is resumed and
        its prompt ends with its first out_pos output tokens).

        An engine that supports controls also takes `controls: LogitsControls | None` and
        `mask: np.ndarray | None` ([W] int32, the first token's allowed set) as keywords."""

    def prefill_batch(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: Sequence[SamplingParams],
        out_pos: Sequence[int] | None = None,
    ) -> list[Prefix]:
        """Several prompts at once, with the same prefixes as one prefill() each (an engine
        that can batch them runs them in fewer calls)."""
        positions = list(out_pos) if out_pos is not None else [0] * len(prompts)
        return [self.prefill(p, s, pos) for p, s, pos in
                zip(prompts, samplings, positions, strict=True)]  # fmt: skip

    # whether prefill_cached() reuses the cached KV (an engine without it computes the whole
    # prompt there: the same Prefix, none of the savings)
    supports_prefix_reuse: bool = False
    # continuation programs for prefill_cached() still being compiled after warm-up (the JAX
    # engine's background thread); the prefill worker reports it in its load
    continuations_pending: int = 0

    def prefill_cached(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        cached_kv: list[np.ndarray],
        out_pos: int = 0,
        **options,
    ) -> Prefix:
        """prefill(), given the KV of the prompt's first m tokens (cached_kv: this engine's own
        arrays, as kv_layout(m) describes them, e.g. cut from an earlier Prefix; 0 < m <
        len(tokens)): only tokens m.. are computed. The Prefix is the whole prompt's, equal to
        prefill()'s to float tolerance. `options` are prefill()'s keywords (controls, mask); a
        request that needs the prompt's logprobs is prefilled from scratch by the caller."""
        return self.prefill(tokens, sampling, out_pos, **options)

    @abc.abstractmethod
    def insert(self, prefix: Prefix, slot: int, sampling: SamplingParams) -> None:
        """Place a prefix (possibly built in another process) into a free slot.

        The slot's next sampled token is output position prefix.out_pos + 1; its input is
        prefix.first_token. With controls (keyword `controls`), the engine counts the history
        from prefix.context and prefix.first_token."""

    @abc.abstractmethod
    def generate(self) -> StepOutput:
        """One decode step over every slot; live slots advance by one token. An engine that
        supports controls takes `masks: StepMasks | None` as a keyword."""

    def generate_many(self, steps: int) -> StepOutput:
        """`steps` decode steps (tokens and logprobs [steps, slots]), each slot's token feeding
        its next step; an engine may run them in one dispatch. A slot that finishes midway
        still advances: the caller drops its later tokens and frees it. It takes no masks: while
        a live slot has controls or a grammar, a worker steps with generate() (the JAX engine
        refuses generate_many then)."""
        outs = [self.generate() for _ in range(steps)]
        return StepOutput(
            tokens=np.stack([o.tokens for o in outs]),
            logprobs=np.stack([o.logprobs for o in outs]),
        )

    def multi_step_ready(self, steps: int) -> bool:
        """Whether generate_many(steps) would run as one dispatch now (the JAX engine runs
        single steps while its k-step program still compiles after a cold warm-up)."""
        return True

    # k-step decode programs still compiling after warm-up (the JAX engine's background
    # thread); the decode worker reports it in its load
    multistep_pending: int = 0

    def share_cores(self, marks: memoryview | None, threads: int) -> None:  # noqa: B027
        """While any byte of `marks` is nonzero (another process of this host is computing:
        splitserve/core_share.py), run the steps' own kernels on at most `threads` threads;
        None: on all of them again. An engine without kernels of its own ignores it."""

    def close(self) -> None:  # noqa: B027 (most engines have nothing to end)
        """The worker is stopping: end any background work (the JAX engine's compiles after
        warm-up). The engine is not used after."""

    @abc.abstractmethod
    def free(self, slot: int) -> None:
        """Release a slot; its contents never influence other slots."""

    @abc.abstractmethod
    def kv_layout(self, length: int) -> list[tuple[np.dtype, tuple[int, ...]]]:
        """(dtype, shape) of each array of a prefix of `length` tokens, as prefill makes them
        and insert takes them: what a decode worker checks an arriving prefix against."""

    @property
    def kv_bytes_per_token(self) -> int:
        """The bytes of a prefix per prompt token: what sizes the decode worker's frames."""
        return sum(np.dtype(dt).itemsize * math.prod(shape) for dt, shape in self.kv_layout(1))
