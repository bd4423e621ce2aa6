"""The JAX engine's prefill: a prompt (or several) in, a Prefix per prompt out.

1. `prefill_batch` checks each prompt and groups them in order, as many per compiled call as
   the (count, length) buckets and the token budget allow; `prefill` is a batch of one.
2. `_pass` pads a group to its bucket and runs the "prefill" program: the last position's
   logits and every position's K/V.
3. The first output token is sampled by the "sample" program, each row by its own parameters;
   a prompt whose first token takes logits controls or a grammar mask runs the "controls"
   program on its logits instead (`_prefill_controlled`), and its prompt logprobs when asked.
4. `_prefixes` cuts each prompt's K/V to its true length, as the numpy arrays the prefill
   worker sends to decode.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitserve.engine.compile.buckets import pick
from splitserve.engine.compile.program_table import ProgramTable
from splitserve.engine.interface import (
    LogitsControls,
    Prefix,
    PromptLogprobs,
    SamplingParams,
    TopLogprobs,
)
from splitserve.engine.jax import programs as prog
from splitserve.engine.jax.control_rows import ControlRows, check_controls
from splitserve.engine.jax.shapes import EngineShapes


class PrefillRunner:
    """Prompts through the prefill side's programs: `params` is that side's pytree, K/V come
    out in `cache_dtype`."""

    def __init__(self, vocab_size: int, shapes: EngineShapes, programs: ProgramTable,
                 params: dict, cache_dtype: np.dtype):  # fmt: skip
        self.vocab_size = vocab_size
        self.shapes = shapes
        self.programs = programs
        self.params = params
        self.cache_dtype = np.dtype(cache_dtype)

    def prefill(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        out_pos: int = 0,
        *,
        controls: LogitsControls | None = None,
        mask: np.ndarray | None = None,
    ) -> Prefix:
        if controls is None and mask is None:
            return self.prefill_batch([tokens], [sampling], [out_pos])[0]
        return self._prefill_controlled(self.check_prompt(tokens), sampling, out_pos,
                                        controls, mask)  # fmt: skip

    def prefill_batch(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: Sequence[SamplingParams],
        out_pos: Sequence[int] | None = None,
    ) -> list[Prefix]:
        """Several prompts, in as few compiled calls as the token budget allows (in order,
        each call padded to a (count, length) bucket); the same prefixes as one at a time."""
        if len(prompts) != len(samplings):
            raise ValueError("one SamplingParams per prompt")
        positions = list(out_pos) if out_pos is not None else [0] * len(prompts)
        checked = [self.check_prompt(p) for p in prompts]
        out: list[Prefix] = []
        start = 0
        while start < len(checked):
            end = start + 1
            while end < len(checked) and self._fits(checked[start:end + 1]):
                end += 1
            out += self._prefill_call(checked[start:end], samplings[start:end],
                                      positions[start:end])  # fmt: skip
            start = end
        return out

    def check_prompt(self, tokens: Sequence[int]) -> np.ndarray:
        """The prompt as an array, once its length and token ids are within this engine's."""
        n = len(tokens)
        if not 1 <= n <= self.shapes.max_seq_len:
            raise ValueError(
                f"prompt of {n} tokens; this engine takes 1..{self.shapes.max_seq_len}"
            )
        ids = np.asarray(tokens, np.int64)
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"token id outside the vocabulary [0, {self.vocab_size})")
        return ids

    def shape(self, prompts: Sequence[np.ndarray]) -> tuple[int, int]:
        """(count, padded length) of the call that runs these prompts."""
        return self.shapes.prefill_shape(len(prompts), max(len(p) for p in prompts))

    def _fits(self, prompts: Sequence[np.ndarray]) -> bool:
        return self.shapes.fits(len(prompts), max(len(p) for p in prompts))

    def _prefill_controlled(self, ids: np.ndarray, sampling: SamplingParams, out_pos: int,
                            controls: LogitsControls | None, mask: np.ndarray | None) -> Prefix:
        """One prompt whose first token takes controls or a mask: the plain prefill pass, then
        the controls program on its logits (one row, its own ControlRows), then the prompt's
        logprobs when asked for."""
        controls = controls or LogitsControls()
        check_controls(controls, self.vocab_size)
        logits, lengths, k_np, v_np = self._pass([ids])
        ints, floats = prog.sampling_rows(sampling, out_pos=out_pos)
        row = ControlRows(1, self.vocab_size)
        row.set(0, controls, ids, out_pos, None)
        masks = {} if mask is None else {0: np.asarray(mask, np.int32)}
        inputs = row.inputs(1, masks)
        program = self.programs.get(("controls", 1, len(inputs) > 6))
        tok, lp, top_ids, top_lps = program(logits, ints, floats, *inputs)
        (prefix,) = self._prefixes(np.asarray(tok), np.asarray(lp), lengths[:1], k_np, v_np,
                                   [out_pos])  # fmt: skip
        k = controls.top_logprobs
        if k:
            prefix.first_top = TopLogprobs(np.asarray(top_ids)[:, :k].copy(),
                                           np.asarray(top_lps)[:, :k].copy())  # fmt: skip
        if controls.needs_history:
            prefix.context = ids.astype(np.int32)
        if controls.prompt_logprobs >= 0 and out_pos == 0:
            prefix.prompt_logprobs = self._prompt_logprobs(ids, controls.prompt_logprobs)
        return prefix

    def _prompt_logprobs(self, ids: np.ndarray, k: int) -> PromptLogprobs:
        """The raw logprob and rank of each prompt token after the first, with top k."""
        length = pick(self.shapes.prefill_buckets, len(ids))
        tokens = np.zeros(length, np.int32)
        tokens[: len(ids)] = ids
        lp, ranks, top_ids, top_lps = self.programs.get(("prompt", length))(self.params, tokens)
        n = len(ids) - 1
        top = None
        if k:
            top = TopLogprobs(np.asarray(top_ids)[:n, :k].copy(),
                              np.asarray(top_lps)[:n, :k].copy())  # fmt: skip
        return PromptLogprobs(np.asarray(lp)[:n].copy(), np.asarray(ranks)[:n].copy(), top)

    def _prefill_call(
        self,
        prompts: Sequence[np.ndarray],
        samplings: Sequence[SamplingParams],
        out_pos: Sequence[int],
    ) -> list[Prefix]:
        count = self.shape(prompts)[0]
        ints = np.zeros((prog.INT_ROWS, count), np.int32)
        floats = np.zeros((prog.FLOAT_ROWS, count), np.float32)
        floats[prog.TOP_P] = 1.0
        for i, (sp, pos) in enumerate(zip(samplings, out_pos, strict=True)):
            ints[:, i:i + 1], floats[:, i:i + 1] = prog.sampling_rows(sp, out_pos=pos)
        logits, lengths, k_np, v_np = self._pass(prompts)
        greedy_only = all(sp.temperature <= 0 for sp in samplings)
        tok, lp = self.programs.get(("sample", count, greedy_only))(logits, ints, floats)
        return self._prefixes(np.asarray(tok), np.asarray(lp), lengths[:len(prompts)], k_np,
                              v_np, out_pos)  # fmt: skip

    def _pass(self, prompts: Sequence[np.ndarray]):
        """The model pass over prompts padded to their bucket: (logits [count, V] on device,
        lengths [count], k, v [count, layers, length, kv_heads, head_dim] as numpy)."""
        count, length = self.shape(prompts)
        tokens = np.zeros((count, length), np.int32)  # padding rows: one token of id 0
        lengths = np.ones(count, np.int32)
        for i, ids in enumerate(prompts):
            tokens[i, :len(ids)] = ids
            lengths[i] = len(ids)
        program = self.programs.get(("prefill", count, length))
        logits, k, v = program(self.params, tokens, lengths)
        return logits, lengths, np.asarray(k), np.asarray(v)

    def _prefixes(self, tok, lp, lengths, k_np, v_np, out_pos) -> list[Prefix]:
        return [
            Prefix(
                kv=[
                    np.ascontiguousarray(k_np[i, :, :n], self.cache_dtype),
                    np.ascontiguousarray(v_np[i, :, :n], self.cache_dtype),
                ],
                length=int(n),
                first_token=int(tok[i]),
                first_logprob=float(lp[i]),
                out_pos=out_pos[i],
            )
            for i, n in enumerate(lengths)
        ]
