"""The engine interface that the prefill and decode workers drive (JetStream-like).

An engine knows nothing of sockets or processes; a worker knows nothing of model math.
The arrays of a Prefix are exactly what travels from the prefill worker to the decode worker,
so they are kept compact: the prompt's true length only, in the cache's own dtype.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. temperature 0 means greedy; top_k 0 and top_p 1 mean off.

    The router always sets a seed (a random one when the client gave none), so that the token
    at output position i depends only on (seed, i, logits), whatever else shares the batch.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0


@dataclass
class Prefix:
    """A prompt's KV cache (true length) and the first sampled token (output position 0)."""

    # engine-defined arrays, e.g. k and v each [layers, length, kv_heads, head_dim]
    kv: list[np.ndarray]
    length: int  # prompt tokens covered by kv
    first_token: int
    first_logprob: float


@dataclass
class StepOutput:
    """Decode output: a token and its log-probability per slot (free slots hold junk);
    [slots] for one step, [steps, slots] from generate_many."""

    tokens: np.ndarray  # [slots] or [steps, slots] int32
    logprobs: np.ndarray  # [slots] or [steps, slots] float32


class Engine(abc.ABC):
    """prefill -> insert into a slot -> generate steps -> free."""

    num_slots: int  # decode batch size
    max_seq_len: int  # prompt + output tokens one slot can hold
    vocab_size: int

    @abc.abstractmethod
    def warmup(self, prefill: bool = True, decode: bool = True) -> None:
        """Compile every shape this engine will run: the prefill buckets (a prefill worker's
        side) and the decode steps (a decode worker's side)."""

    @abc.abstractmethod
    def prefill(self, tokens: Sequence[int], sampling: SamplingParams) -> Prefix:
        """Run the prompt; sample output position 0."""

    def prefill_batch(
        self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingParams]
    ) -> list[Prefix]:
        """Several prompts at once, with the same prefixes as one prefill() each (an engine
        that can batch them runs them in fewer calls)."""
        return [self.prefill(p, s) for p, s in zip(prompts, samplings, strict=True)]

    @abc.abstractmethod
    def insert(self, prefix: Prefix, slot: int, sampling: SamplingParams) -> None:
        """Place a prefix (possibly built in another process) into a free slot.

        The slot's next sampled token is output position 1; its input is prefix.first_token.
        """

    @abc.abstractmethod
    def generate(self) -> StepOutput:
        """One decode step over every slot; live slots advance by one token."""

    def generate_many(self, steps: int) -> StepOutput:
        """`steps` decode steps (tokens and logprobs [steps, slots]), each slot's token feeding
        its next step; an engine may run them in one dispatch. A slot that finishes midway
        still advances: the caller drops its later tokens and frees it."""
        outs = [self.generate() for _ in range(steps)]
        return StepOutput(
            tokens=np.stack([o.tokens for o in outs]),
            logprobs=np.stack([o.logprobs for o in outs]),
        )

    @abc.abstractmethod
    def free(self, slot: int) -> None:
        """Release a slot; its contents never influence other slots."""
