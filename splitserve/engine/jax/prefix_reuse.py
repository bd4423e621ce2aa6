"""The JAX engine's prefill from a cached prefix (Engine.prefill_cached): a prompt whose first m
tokens' K/V are known runs one "prefill continuation" program (model/prefill_continue.py)
over tokens m.., bucketed by (cached length, new length) over the prefill buckets, and its
Prefix is built exactly as prefill's (the whole prompt's KV, cut to its true length, plus the
first token sampled by the same "sample" program).

Kept apart from prefill.py so that the plain prefill path is untouched. There is one program
per bucket pair (many for a long context: compiling them before Ready made a cold start minutes
longer), so they are deferred programs (program_specs.py): compiled after warm-up on a
background thread unless the executable store has them, and until a prompt's program is ready
it is prefilled whole (cached_tokens 0): the same result, only slower.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitserve.engine.compile.buckets import pick
from splitserve.engine.compile.program_table import ProgramTable
from splitserve.engine.interface import Prefix, SamplingParams
from splitserve.engine.jax import programs as prog
from splitserve.engine.jax.prefill import PrefillRunner
from splitserve.engine.model.llama_config import LlamaConfig


class CachedPrefill:
    """Prefill from a cached prefix, over the prefill side's `params`; a prompt it cannot
    continue goes to `runner`, whole."""

    def __init__(self, cfg: LlamaConfig, buckets: Sequence[int], programs: ProgramTable,
                 params: dict, cache_dtype: np.dtype, runner: PrefillRunner):  # fmt: skip
        self.cfg = cfg
        self.buckets = tuple(buckets)  # the prefill buckets: cached and new lengths pad to them
        self.programs = programs
        self.params = params
        self.cache_dtype = np.dtype(cache_dtype)
        self.runner = runner

    def prefill_cached(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        cached_kv: list[np.ndarray],
        out_pos: int = 0,
        **options,
    ) -> Prefix:
        if any(v is not None for v in options.values()):
            # logits controls go through prefill's own path (which owns their processing);
            # its Prefix says nothing was reused (cached_tokens 0)
            return self.runner.prefill(tokens, sampling, out_pos, **options)
        ids = self.runner.check_prompt(tokens)
        cfg = self.cfg
        ck, cv = cached_kv
        m, n = ck.shape[1], len(ids) - ck.shape[1]
        want = (cfg.layers, m, cfg.kv_heads, cfg.head_dim)
        if not 0 < m < len(ids) or tuple(ck.shape) != want or tuple(cv.shape) != want:
            raise ValueError(f"cached KV {ck.shape} for a prompt of {len(ids)} tokens")
        c, t = pick(self.buckets, m), pick(self.buckets, n)
        key = ("prefill_cont", c, t)
        if key not in self.programs.compiled:  # still compiling in the background: it all
            return self.runner.prefill(tokens, sampling, out_pos)
        padded = []
        for arr in (ck, cv):
            out = np.zeros((cfg.layers, c, cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            out[:, :m] = arr
            padded.append(out)
        new = np.zeros(t, np.int32)
        new[:n] = ids[m:]
        logits, k, v = self.programs.get(key)(self.params, padded[0], padded[1], np.int32(m),
                                              new, np.int32(n))  # fmt: skip
        ints, floats = prog.sampling_rows(sampling, out_pos=out_pos)
        sample = self.programs.get(("sample", 1, sampling.temperature <= 0))
        tok, lp = sample(logits, ints, floats)
        k_np, v_np = np.asarray(k), np.asarray(v)  # [layers, T, KV, D]
        kv = [np.concatenate([old, np.asarray(fresh[:, :n], self.cache_dtype)], axis=1)
              for old, fresh in ((ck, k_np), (cv, v_np))]  # fmt: skip
        return Prefix(kv=kv, length=len(ids), first_token=int(np.asarray(tok)[0]),
                      first_logprob=float(np.asarray(lp)[0]), out_pos=out_pos,
                      cached_tokens=m)  # fmt: skip
