"""JaxEngine's prefill from a cached prefix (Engine.prefill_cached), as a mixin: the keys of
the "prefill continuation" programs (model/prefill_continue.py; compiled_programs.py lowers
them), their compile in the background, and the call.

Kept apart from engine.py so that the engine's own prefill path is untouched: a prompt
with a cached prefix runs one continuation program, bucketed by (cached length, new length)
over the prefill buckets, and its Prefix is built exactly as prefill's (the whole prompt's KV,
cut to its true length, plus the first token sampled by the same "sample" program).

There is one program per bucket pair (63 for the default 2,048-token context): compiling them
before Ready made a cold start minutes longer. They are deferred programs (compiled_programs.py):
compiled after warm-up on a background thread unless the executable store has them, and until
a prompt's program is ready it is prefilled whole (cached_tokens 0): the same result, only
slower.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitserve.engine.compile.buckets import pick
from splitserve.engine.interface import Prefix, SamplingParams
from splitserve.engine.model.prefill_continue import continue_shapes


class PrefixReuse:
    """Mixed into JaxEngine; uses its cfg, params, buckets, _program, _sampling_rows and
    deferred_pending."""

    supports_prefix_reuse = True
    prefix_reuse = False  # whether warm-up compiles the continuation programs (the cache is on)

    @property
    def continuations_pending(self) -> int:
        """Continuation programs the background thread has still to obtain."""
        return self.deferred_pending("prefill_cont")

    def continue_keys(self) -> list[tuple]:
        if not self.prefix_reuse:
            return []
        pairs = continue_shapes(self.shapes.prefill_buckets, self.max_seq_len)
        return [("prefill_cont", c, t) for c, t in pairs]

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
            return self.prefill(tokens, sampling, out_pos, **options)
        ids = self._check_prompt(tokens)
        cfg = self.cfg
        ck, cv = cached_kv
        m, n = ck.shape[1], len(ids) - ck.shape[1]
        want = (cfg.layers, m, cfg.kv_heads, cfg.head_dim)
        if not 0 < m < len(ids) or tuple(ck.shape) != want or tuple(cv.shape) != want:
            raise ValueError(f"cached KV {ck.shape} for a prompt of {len(ids)} tokens")
        c, t = pick(self.shapes.prefill_buckets, m), pick(self.shapes.prefill_buckets, n)
        key = ("prefill_cont", c, t)
        if key not in self._programs:  # still compiling in the background: the whole prompt
            return self.prefill(tokens, sampling, out_pos)
        padded = []
        for arr in (ck, cv):
            out = np.zeros((cfg.layers, c, cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            out[:, :m] = arr
            padded.append(out)
        new = np.zeros(t, np.int32)
        new[:n] = ids[m:]
        logits, k, v = self._program(key)(self.params, padded[0], padded[1], np.int32(m), new,
                                          np.int32(n))  # fmt: skip
        ints, floats = self._sampling_rows(sampling, out_pos=out_pos)
        tok, lp = self._program(("sample", 1, sampling.temperature <= 0))(logits, ints, floats)
        k_np, v_np = np.asarray(k), np.asarray(v)  # [layers, T, KV, D]
        kv = [np.concatenate([old, np.asarray(fresh[:, :n], self.cache_dtype)], axis=1)
              for old, fresh in ((ck, k_np), (cv, v_np))]  # fmt: skip
        return Prefix(kv=kv, length=len(ids), first_token=int(np.asarray(tok)[0]),
                      first_logprob=float(np.asarray(lp)[0]), out_pos=out_pos,
                      cached_tokens=m)  # fmt: skip
