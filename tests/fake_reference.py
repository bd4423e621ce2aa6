"""The fake engine's documented arithmetic with logits controls (splitserve/engine/fake/engine.py's
docstring), written again here from the text, in plain numpy, so that the tests check the engine
and the whole pipeline against a reference that shares no code with them."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np


def stride(vocab: int) -> int:
    p = 7919
    while vocab % p == 0 or any(p % q == 0 for q in range(2, int(math.isqrt(p)) + 1)):
        p += 1
    return p


def logits(choice: int, vocab: int) -> np.ndarray:
    """z[v] = -s * ((v - c) * P mod V), s = (1 + c mod 10) / 10."""
    d = ((np.arange(vocab) - choice) * stride(vocab)) % vocab
    return -((1 + choice % 10) / 10) * d.astype(np.float64)


@dataclass
class Request:
    """What a request asks for (the API's names; neutral values by default)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    bad_words: list[list[int]] = field(default_factory=list)
    top_logprobs: int = 0


def process(z: np.ndarray, req: Request, prompt: list[int], output: list[int], allowed=None):
    """The interface's steps 1-6, in its order."""
    z = z.copy()
    if allowed is not None:
        z[~allowed] = -np.inf
    banned = z.copy()
    for word in req.bad_words:
        head = list(word[:-1])
        if not head or output[len(output) - len(head) :] == head:
            banned[word[-1]] = -np.inf
    if np.isfinite(banned).any():
        z = banned
    for t, b in req.logit_bias.items():
        z[t] += b
    seen = set(prompt) | set(output)
    for t in seen:
        r = req.repetition_penalty
        z[t] = z[t] / r if z[t] > 0 else z[t] * r
    for t, n in Counter(output).items():
        z[t] -= req.frequency_penalty * n + req.presence_penalty
    if req.temperature <= 0:
        return z
    z = z / req.temperature
    p = np.exp(z - z.max())
    if req.min_p > 0:
        z = np.where(p >= req.min_p * p.max(), z, -np.inf)
    if 0 < req.top_k < z.size:
        z = np.where(z >= np.sort(z)[-req.top_k], z, -np.inf)
    if req.top_p < 1:
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        keep = np.zeros(z.size, bool)
        keep[order[before < req.top_p]] = True
        z = np.where(keep, z, -np.inf)
    return z


def pick(z: np.ndarray, choice: int, k: int):
    """(token, logprob, [(id, logprob)] * k): argmax, ties to the smaller d."""
    vocab = z.size
    logp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
    order = (choice + np.arange(vocab) * pow(stride(vocab), -1, vocab)) % vocab  # by d
    ranked = order[np.argsort(-logp[order], kind="stable")]
    token = int(ranked[0])
    return token, float(logp[token]), [(int(t), float(logp[t])) for t in ranked[:k]]


def generate(prompt: list[int], vocab: int, req: Request, max_tokens: int, eos=(), masks=None):
    """[(token, logprob, top)] the fake produces; stops after an eos token or max_tokens.
    masks(output so far) -> allowed [V] bool or None (a grammar)."""
    out: list[tuple[int, float, list]] = []
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        if not tokens:
            choice = (2 * sum(prompt)) % vocab
        else:
            choice = (4 * tokens[-1] + len(tokens)) % vocab
        allowed = masks(tokens) if masks is not None else None
        z = process(logits(choice, vocab), req, prompt, tokens, allowed)
        token, lp, top = pick(z, choice, req.top_logprobs)
        out.append((token, lp, top))
        tokens.append(token)
        if token in eos:
            break
    return out
