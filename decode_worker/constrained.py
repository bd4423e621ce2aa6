"""What the decode worker adds around the engine for requests with logits controls or a grammar
(per-slot inputs of the compiled step; the grammar advances here, where each token is first
known, and its next mask is computed while a step runs); a batch without any takes exactly the
plain path.

- insert: the engine gets the request's LogitsControls and its history (the prompt, whose last
  first_seq tokens are the output so far) when they need it; a grammar gets its matcher, replayed
  over the output so far and the first token (a request moved from a dead worker included).
- each step: the masks of the constrained slots (computed on a thread since the previous step's
  tokens came, splitserve/grammar/masks.py) go to the engine; the step's tokens advance the
  matchers; a slot whose grammar fails is failed before its token goes anywhere.
- top logprobs: the step's alternatives, cut to what each slot asked for.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

import numpy as np

from decode_worker.slots import Slot
from splitserve.engine.interface import Engine, Prefix, StepOutput, TopLogprobs
from splitserve.grammar.masks import SlotGrammars
from splitserve.grammar.matcher import GrammarState
from splitserve.grammar.vocabulary import ready
from splitserve.protocol import LogitsControls, PrefixHeader

log = logging.getLogger(__name__)

NEUTRAL = LogitsControls()


class ConstrainedSlots:
    """The decode worker's per-slot controls and grammars."""

    def __init__(self, engine: Engine, vocabulary: Future):
        self.engine = engine
        self.vocabulary = vocabulary  # Future of the llguidance tokenizer (grammar/vocabulary.py)
        self.grammars = SlotGrammars(engine.vocab_size)
        self.controlled: set[int] = set()  # slots inserted with controls (a grammar included)

    def refusal(self, header: PrefixHeader) -> str | None:
        """Why this worker cannot take the request, if it cannot."""
        if (header.controls is not None or header.grammar) and not self.engine.supports_controls:
            return "this engine does not support logits controls or grammars"
        if any(not 0 <= t < self.engine.vocab_size for t in header.context):
            return f"prompt context outside the vocabulary ({self.engine.vocab_size})"
        if header.controls is not None:
            return header.controls.outside(self.engine.vocab_size)
        return None

    def prefix(self, header: PrefixHeader, kv: list[np.ndarray]) -> Prefix:
        prefix = Prefix(kv, header.length, header.first_token, header.first_logprob,
                        header.first_seq)  # fmt: skip
        if header.context:
            prefix.context = np.asarray(header.context, np.int32)
        if header.first_top_ids:
            prefix.first_top = TopLogprobs(
                np.asarray([header.first_top_ids], np.int32),
                np.asarray([header.first_top_logprobs], np.float32),
            )
        return prefix

    def insert(self, header: PrefixHeader, prefix: Prefix, slot: int, state: Slot) -> None:
        """engine.insert with whatever the request needs; ValueError (GrammarError included)
        when it cannot be served (the caller fails the request). Waits for the grammar
        vocabulary at the first grammar, if it is still being built."""
        if header.controls is None and not header.grammar:
            self.engine.insert(prefix, slot, header.sampling)
            return
        grammar = None
        if header.grammar:
            ends = [*header.stop.eos_ids, *header.stop.stop_token_ids]
            grammar = GrammarState(ready(self.vocabulary), header.grammar, ends)
            context, n = header.context, header.first_seq
            so_far = context[len(context) - n :] if n else []  # the output before first_token
            grammar.replay([*so_far, header.first_token])
        # a grammar alone still takes the controlled path (neutral controls): its first token
        # was the mask's choice, not the model's own
        controls = header.controls or NEUTRAL
        self.engine.insert(prefix, slot, header.sampling, controls=controls)  # type: ignore[call-arg]
        self.controlled.add(slot)
        state.top_logprobs = controls.top_logprobs
        if state.top_logprobs and header.first_top_ids:
            state.tops.append((list(header.first_top_ids), list(header.first_top_logprobs)))
        elif state.top_logprobs:
            state.tops.append(([], []))
        if grammar is not None:
            self.grammars.add(slot, grammar)

    def generate(self) -> tuple[StepOutput, dict[int, str]]:
        """One engine step, masked where a grammar says; {slot: error} of slots whose grammar
        failed (their tokens must not be used)."""
        masks, errors = self.grammars.masks()
        if masks is None and not self.grammars:
            out = self.engine.generate()
        else:
            out = self.engine.generate(masks=masks)  # type: ignore[call-arg]
        if self.grammars:
            errors.update(self.grammars.advance(out.tokens.tolist()))
        return out, errors

    def prepare(self) -> None:
        """The step's tokens are in: start on the next step's masks."""
        if self.grammars:
            self.grammars.prepare()

    @property
    def single_steps(self) -> bool:
        """Some live slot has controls or a grammar: the next step must be one generate() (its
        mask and the previous step's tokens are per step; an engine refuses generate_many)."""
        return bool(self.controlled)

    def free(self, slot: int) -> None:
        self.grammars.remove(slot)
        self.controlled.discard(slot)

    @staticmethod
    def alternatives(
        out: StepOutput, slot: int, state: Slot
    ) -> tuple[list[int], list[float]] | None:
        """The slot's top logprobs of the step (as many as it asked for), or None."""
        k = state.top_logprobs
        if not k or out.top is None:
            return None
        return out.top.ids[slot, :k].tolist(), out.top.logprobs[slot, :k].tolist()

    def close(self) -> None:
        self.grammars.close()
