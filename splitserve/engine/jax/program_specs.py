"""What the JAX engine compiles: each program key's jitted function and argument specs, the keys
each side runs, and what besides a key shapes an executable.

1. `keys` lists every shape a prefill or a decode worker runs (batch, capacity and length
   buckets; engine.py says what each program does).
2. `deferred_keys` are those with a stand-in, which may arrive after the worker says Ready
   (compile/program_table.py): a prefix-cache continuation runs the whole prompt meanwhile, a
   k-step decode program k single steps.
3. `lowered` gives a key's jitted function (programs.py) and the argument specs it is lowered
   with, for the program table to compile.
4. `identity` is everything besides a key that shapes an executable: the executable store keys
   its files by both (compile/executables.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from splitserve.engine.interface import MAX_BAD_WORDS, MAX_LOGIT_BIAS
from splitserve.engine.jax import controls as ctl
from splitserve.engine.jax import programs as prog
from splitserve.engine.jax.kv_cache import cache_shapes
from splitserve.engine.jax.shapes import EngineShapes
from splitserve.engine.jax.weights import SideParams
from splitserve.engine.kernels import qkernel
from splitserve.engine.model.llama_config import LlamaConfig
from splitserve.engine.model.prefill_continue import continue_shapes, prefill_continue_fn


def attention_paths(attention: str, cfg: LlamaConfig) -> tuple[str, str]:
    """(the decode step's, the prompt pass's) attention, each "native" (the kernel's) or "xla",
    for `attention` "auto" (the kernel's where it is built), "native" or "xla"."""
    if attention not in ("auto", "native", "xla"):
        raise ValueError(f"attention {attention!r}: auto, native or xla")
    if attention == "auto":
        attention = "native" if qkernel.available() else "xla"
    # a prompt pass's attention in the kernel only where its blocked path runs (AVX-512,
    # head_dim 64): position by position XLA's batched products are faster
    fast = qkernel.prompt_attention_fast(cfg.head_dim, cfg.group)
    return attention, "native" if attention == "native" and fast else "xla"


class ProgramSpecs:
    """The programs of one engine configuration. attention / prompt_attention: "native" or
    "xla", the decode step's and the prompt pass's; prefix_reuse: whether the prefix cache's
    continuation programs are among the keys."""

    def __init__(
        self, cfg: LlamaConfig, shapes: EngineShapes, params: SideParams, cache_dtype: np.dtype,
        attention: str, prompt_attention: str, prefix_reuse: bool,
    ):  # fmt: skip
        self.cfg = cfg
        self.shapes = shapes
        self.params = params
        self.cache_dtype = np.dtype(cache_dtype)
        self.attention = attention
        self.prompt_attention = prompt_attention
        self.prefix_reuse = prefix_reuse

    def identity(self) -> str:
        """Everything besides a program's key that shapes its executable: the model's
        configuration, the slots, the dtypes, the formats and the parameters' tree."""
        leaves = lambda tree: [(tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(tree)]  # noqa: E731
        p = self.params
        trees = list({id(t): t for t in [*p.decode_at.values(), p.prefill]}.values())
        return repr((self.cfg, self.shapes.num_slots, str(self.cache_dtype), self.attention,
                     self.prompt_attention, p.weight_format, p.prefill_weight_format,
                     [(jax.tree.structure(t), leaves(t)) for t in trees]))  # fmt: skip

    def keys(self, prefill: bool = True, decode: bool = True) -> list[tuple]:
        """Every shape this engine runs (the prefill side, the decode side, or both)."""
        sh = self.shapes
        keys: list[tuple] = []
        if prefill:  # prefill samples one row per prompt, greedy or not
            keys += [("sample", c, g) for c in sh.prefill_counts for g in (True, False)]
            keys += [("prefill", c, t) for c, t in sh.prefill_shapes]
            # a prompt with controls or a first-token mask (prompt logprobs, rare and one
            # program per length, compile on first use)
            keys += [("controls", 1, h) for h in (False, True)]
            # (the prefix cache's continuation programs are deferred_keys)
        if decode:  # decode samples every row of the batch when some row is not greedy
            keys += [("sample", b, False) for b in sh.batch_buckets]
            keys += [("controls", n, h) for n in sh.control_counts for h in (False, True)]
            keys += [("gather", b, n) for b in sh.batch_buckets for n in sh.control_counts
                     if n <= b]  # fmt: skip
            for i, c in enumerate(sh.decode_buckets):
                keys += [("decode", b, c, k) for b in sh.batch_buckets
                         for k in sh.decode_steps if k == 1 or b <= sh.chunk_batch]
                widths = sorted({min(p, c) for p in sh.prefill_buckets})
                keys += [("insert", w, c) for w in widths]
                if len(sh.batch_buckets) > 1:
                    keys.append(("move", c))
                if i > 0:
                    prev = sh.decode_buckets[i - 1]
                    keys += [("resize", prev, c), ("resize", c, prev)]
        return list(dict.fromkeys(keys))

    def continue_keys(self) -> list[tuple]:
        """The prefix cache's continuation programs, one per (cached, new) bucket pair some
        prompt needs (none while the cache is off)."""
        if not self.prefix_reuse:
            return []
        pairs = continue_shapes(self.shapes.prefill_buckets, self.shapes.max_seq_len)
        return [("prefill_cont", c, t) for c, t in pairs]

    def deferred_keys(self, prefill: bool = True, decode: bool = True) -> list[tuple]:
        """The programs that may arrive after Ready because each has a stand-in meanwhile:
        the prefix cache's continuations (a prompt runs whole instead) and the k-step decode
        programs (k single steps instead)."""
        keys = self.continue_keys() if prefill else []
        if decode:
            keys += [k for k in self.keys(False, True) if k[0] == "decode" and k[3] > 1]
        return keys

    def _cache_specs(self, capacity: int) -> tuple[list, list]:
        k, v = cache_shapes(self.cfg, self.shapes.num_slots, capacity)
        spec = jax.ShapeDtypeStruct
        n = self.cfg.layers
        return [spec(k, self.cache_dtype)] * n, [spec(v, self.cache_dtype)] * n

    def lowered(self, key: tuple) -> tuple[Callable, list]:
        """The jitted function of a key and the arguments (specs) it is lowered with."""
        cfg = self.cfg
        params = self.params.prefill
        i32, f32 = jnp.int32, jnp.float32
        spec = jax.ShapeDtypeStruct
        kind = key[0]
        if kind == "prefill":  # ("prefill", count, padded length)
            fn = jax.jit(partial(prog.prefill_fn, cfg, self.prompt_attention))
            return fn, [params, spec((key[1], key[2]), i32), spec((key[1],), i32)]
        if kind == "sample":  # ("sample", rows, greedy only)
            rows = key[1]
            fn = jax.jit(partial(prog.sample_fn, key[2]))
            return fn, [spec((rows, cfg.vocab_size), f32), spec((prog.INT_ROWS, rows), i32),
                        spec((prog.FLOAT_ROWS, rows), f32)]  # fmt: skip
        if kind == "controls":  # ("controls", rows, with penalty history)
            rows, vocab = key[1], cfg.vocab_size
            args = [spec((rows, vocab), f32), spec((prog.INT_ROWS, rows), i32),
                    spec((prog.FLOAT_ROWS, rows), f32), spec((ctl.CF_ROWS, rows), f32),
                    spec((ctl.FLAG_ROWS, rows), i32), spec((rows, -(-vocab // 32)), i32),
                    spec((rows, MAX_LOGIT_BIAS), i32), spec((rows, MAX_LOGIT_BIAS), f32),
                    spec((rows, MAX_BAD_WORDS), i32)]
            if key[2]:
                args.append(spec((rows, vocab), i32))
            return jax.jit(prog.controls_fn), args
        if kind == "gather":  # ("gather", batch, rows): the controlled rows' logits
            return jax.jit(prog.gather_fn), [spec((key[1], cfg.vocab_size), f32),
                                             spec((key[2],), i32)]  # fmt: skip
        if kind == "prompt":  # ("prompt", padded length): prompt logprobs
            return jax.jit(partial(prog.prompt_fn, cfg)), [params, spec((key[1],), i32)]
        if kind == "insert":  # ("insert", width, capacity), one layer
            part = spec((key[1], cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            ck, cv = (x[0] for x in self._cache_specs(key[2]))
            fn = jax.jit(prog.insert_fn, donate_argnums=(0, 1))
            return fn, [ck, cv, part, part, spec((), i32)]
        if kind == "resize":  # ("resize", from capacity, to capacity), one layer
            ck, cv = (x[0] for x in self._cache_specs(key[1]))
            return jax.jit(partial(prog.resize_fn, key[2])), [ck, cv]
        if kind == "move":  # ("move", capacity), every layer
            fn = jax.jit(prog.move_fn, donate_argnums=(0, 1))
            return fn, [*self._cache_specs(key[1]), spec((), i32), spec((), i32)]
        if kind == "decode":  # ("decode", batch, capacity, steps)
            _, batch, capacity, steps = key
            args = [self.params.decode_at[batch], *self._cache_specs(capacity),
                    spec((prog.INT_ROWS, batch), i32)]
            if steps > 1:
                args.append(spec((prog.FLOAT_ROWS, batch), f32))
            return prog.jit_decode(cfg, steps, self.attention), args
        if kind == "prefill_cont":  # ("prefill_cont", cached bucket, new bucket): prefix_reuse.py
            _, c, t = key
            kv = spec((cfg.layers, c, cfg.kv_heads, cfg.head_dim), self.cache_dtype)
            fn = jax.jit(partial(prefill_continue_fn, cfg))
            return fn, [params, kv, kv, spec((), i32), spec((t,), i32), spec((), i32)]
        raise KeyError(key)
