"""The float32 products of one decode step, alone: a model's matrices (random values, its shapes,
in the order a step reads them: each layer's QKV, output, gate/up and down products, then the
head) chained through the native kernel's float32 rows at one batch row, in one jitted program.
What a step would cost if it were nothing but reading its weights through the kernel.

    .venv/bin/python lab/engine/float32_chain.py --model default --threads 2

Compare with `lab/engine/read_rate.c` (the same bytes read by plain loops and by the kernel's own
row code under OpenMP, outside XLA) and with `lab/engine/engine_steps.py ... float32:1` (the whole
step).
Prints each round's median call and the read rate it implies.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def step_shapes(cfg) -> list[tuple[int, int]]:
    """(out, in) of every product a one-row float32 step runs, in order."""
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    layer = [(q + 2 * kv, cfg.hidden), (cfg.hidden, q), (2 * cfg.intermediate, cfg.hidden),
             (cfg.hidden, cfg.intermediate)]  # fmt: skip
    return layer * cfg.layers + [(cfg.vocab_size, cfg.hidden)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2, help="XLA intra-op threads")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="timed calls per round")
    ap.add_argument("--small-pages", action="store_true", help="leave the weights on 4 KiB pages")
    args = ap.parse_args(argv)

    from splitserve.engine.compile.jax_setup import configure_jax_runtime

    configure_jax_runtime(cpu_threads=args.threads)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from splitserve.engine import resolve_model_path
    from splitserve.engine.kernels import huge_pages, qkernel
    from splitserve.engine.model.model_files import load_model

    if not qkernel.available():
        sys.exit(f"no native kernel: {qkernel.unavailable_reason()}")
    cfg, _ = load_model(resolve_model_path(args.model))
    shapes = step_shapes(cfg)
    odd = sorted({k for _, k in shapes if k % 32})
    if odd:  # the engine runs such products in XLA, not in the kernel's float32 rows
        sys.exit(f"the kernel's float32 rows take inputs in multiples of 32, not {odd}")
    rng = np.random.default_rng(0)
    mats = [jnp.asarray(rng.standard_normal(s, dtype=np.float32) * 0.02) for s in shapes]
    nbytes = sum(m.nbytes for m in mats)
    moved = 0 if args.small_pages else huge_pages.collapse(mats)

    def chain(x, mats):
        # each product's input is the previous result cut or tiled to the next one's width: the
        # values do not matter, only that every product waits for the one before, as in a step
        y = x
        for m in mats:
            k = m.shape[1]
            y = jnp.tile(y, -(-k // y.shape[-1]))[:, :k] if y.shape[-1] != k else y
            y = qkernel.qmatmul("f32", y, [m], m.shape[0])
        return y

    run = jax.jit(chain)
    x = jnp.ones((1, cfg.hidden), jnp.float32)
    for _ in range(3):
        run(x, mats).block_until_ready()
    rounds = []
    for _ in range(args.rounds):
        times = []
        for _ in range(args.calls):
            t = time.perf_counter()
            run(x, mats).block_until_ready()
            times.append(time.perf_counter() - t)
        rounds.append(statistics.median(times))
    best = min(rounds)
    print(
        f"{len(shapes)} float32 products, {nbytes / 1e6:.0f} MB ({moved / 1e6:.0f} MB moved to "
        f"huge pages), {args.threads} XLA thread(s), one batch row"
    )
    print("round medians, ms: " + ", ".join(f"{r * 1e3:.2f}" for r in rounds))
    print(f"best round {best * 1e3:.2f} ms: {nbytes / best / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
