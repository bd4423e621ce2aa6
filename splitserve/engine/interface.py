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
    # the output position first_token was sampled at: 0, or n for a request resumed after its
    # n output tokens (which then end its prompt)
    out_pos: int = 0


@dataclass
class StepOutput:
    """One decode step: a token and its log-probability per slot (free slots hold junk)."""

    tokens: np.ndarray  # [slots] int32
    logprobs: np.ndarray  # [slots] float32


class Engine(abc.ABC):
    """prefill -> insert into a slot -> generate steps -> free."""

    num_slots: int  # decode batch size
    max_seq_len: int  # prompt + output tokens one slot can hold
    vocab_size: int

    @abc.abstractmethod
    def warmup(self, prefill: bool = True, decode: bool = True, progress=None) -> None:
        """Compile every shape this engine will run: the prefill buckets (a prefill worker's
        side) and the decode steps (a decode worker's side). progress(key, done, total,
        seconds), when given, is told of each program as it is ready (for the start-up log)."""

    @abc.abstractmethod
    def prefill(self, tokens: Sequence[int], sampling: SamplingParams, out_pos: int = 0) -> Prefix:
        """Run the prompt; sample output position out_pos (0, unless the request is resumed and
        its prompt ends with its first out_pos output tokens)."""

    @abc.abstractmethod
    def insert(self, prefix: Prefix, slot: int, sampling: SamplingParams) -> None:
        """Place a prefix (possibly built in another process) into a free slot.

        The slot's next sampled token is output position prefix.out_pos + 1; its input is
        prefix.first_token.
        """

    @abc.abstractmethod
    def generate(self) -> StepOutput:
        """One decode step over every slot; live slots advance by one token."""

    @abc.abstractmethod
    def free(self, slot: int) -> None:
        """Release a slot; its contents never influence other slots."""
