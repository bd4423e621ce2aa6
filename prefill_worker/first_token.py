"""What the prefill worker adds for requests with logits controls or a grammar: the first token
is constrained too (its mask from a matcher replayed over the output so far), its alternatives
and the prompt's logprobs go to the detok worker, and the decode worker gets what it needs to
carry on (controls, grammar, and the prompt when the history matters)."""

from __future__ import annotations

from concurrent.futures import Future

from splitserve.engine.interface import Engine, Prefix
from splitserve.grammar.matcher import GrammarState
from splitserve.grammar.vocabulary import ready
from splitserve.protocol import GenerateRequest, PromptScores


class FirstToken:
    def __init__(self, engine: Engine, vocabulary: Future):
        self.engine = engine
        self.vocabulary = vocabulary  # Future of the llguidance tokenizer

    def refusal(self, req: GenerateRequest) -> str | None:
        if (req.controls is not None or req.grammar) and not self.engine.supports_controls:
            return "this engine does not support logits controls or grammars"
        if req.controls is not None:
            return req.controls.outside(self.engine.vocab_size)
        return None

    def prefill(self, req: GenerateRequest, cached_kv: list | None = None) -> Prefix:
        """engine.prefill with the request's controls and first mask, or engine.prefill_cached
        when the KV of the prompt's start is given; ValueError (GrammarError included) when it
        cannot run."""
        options = {}
        if req.controls is not None or req.grammar:
            mask = None
            if req.grammar:
                ends = [*req.stop.eos_ids, *req.stop.stop_token_ids]
                grammar = GrammarState(ready(self.vocabulary), req.grammar, ends)
                grammar.replay(output_so_far(req))
                mask = grammar.mask()
            options = {"controls": req.controls, "mask": mask}
        if cached_kv is not None:
            return self.engine.prefill_cached(req.prompt, req.sampling, cached_kv,
                                              out_pos=req.start_seq, **options)  # fmt: skip
        return self.engine.prefill(req.prompt, req.sampling, out_pos=req.start_seq, **options)

    @staticmethod
    def context(req: GenerateRequest) -> list[int]:
        """The prompt, when the decode side needs the history: penalties and bad words count
        it, a grammar replays the output so far (a resumed request's prompt ends with it)."""
        needs = req.controls is not None and req.controls.needs_history
        return list(req.prompt) if needs or (req.grammar and req.start_seq) else []

    @staticmethod
    def alternatives(prefix: Prefix) -> tuple[list[int], list[float]] | None:
        if prefix.first_top is None:
            return None
        return prefix.first_top.ids[0].tolist(), prefix.first_top.logprobs[0].tolist()

    @staticmethod
    def prompt_scores(prefix: Prefix) -> PromptScores | None:
        scores = prefix.prompt_logprobs
        if scores is None:
            return None
        lps, ranks = scores.logprobs.tolist(), scores.ranks.tolist()
        if scores.top is None:
            return PromptScores(lps, ranks)
        return PromptScores(lps, ranks, scores.top.ids.tolist(), scores.top.logprobs.tolist())


def output_so_far(req: GenerateRequest) -> list[int]:
    return list(req.prompt[len(req.prompt) - req.start_seq :]) if req.start_seq else []
