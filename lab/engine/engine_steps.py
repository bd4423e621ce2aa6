"""The decode step of engine variants, measured against each other in one process: weight format,
live slots, steps per dispatch, attention kernel. Prints a markdown table.

    .venv/bin/python lab/engine/engine_steps.py --model default --threads 1 \\
        gguf:1 gguf:4 gguf:16 float32:1 float32:4 float32:16

A variant is FORMAT:LIVE[:STEPS[:ATTENTION[:SLOTS[:PAGES]]]] (FORMAT a weight format, or
xla-float32: float32 in XLA's products at every batch, as before the kernel's float32 rows;
STEPS per dispatch, default 1; ATTENTION auto, native or xla; SLOTS default --slots, so
LIVE < SLOTS runs a smaller batch bucket: gguf:1 against gguf:1:1:auto:1 is a 16-slot engine
with one live slot against a 1-slot engine; PAGES huge, the default, or small: the weights
left on the pages they were placed on; an empty field keeps its default). One cache capacity
(--capacity); LIVE slots hold a --context-token prefix, refilled before each round so the
attended length stays near it. Rounds alternate the variants (every variant once per round,
--steps steps each) so that a busy host slows them alike; the table gives the median
over rounds of each round's median step (wall and process CPU time), each as a ratio to the
first variant. On a shared host compare ratios from one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def parse_variant(text: str, slots: int) -> tuple[str, int, int, str, int, bool]:
    parts = text.split(":")
    if not 2 <= len(parts) <= 6 or (len(parts) == 6 and parts[5] not in ("huge", "small")):
        raise ValueError(f"variant {text!r}: FORMAT:LIVE[:STEPS[:ATTENTION[:SLOTS[:PAGES]]]]")
    steps = int(parts[2]) if len(parts) > 2 else 1
    attention = parts[3] if len(parts) > 3 and parts[3] else "auto"
    slots = int(parts[4]) if len(parts) > 4 and parts[4] else slots
    return parts[0], int(parts[1]), steps, attention, slots, parts[5:] != ["small"]


XLA_FLOAT32 = "xla-float32"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="FORMAT:LIVE[:STEPS[:ATTENTION[:SLOTS[:PAGES]]]]")
    ap.add_argument("--model", default="default")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=256)
    ap.add_argument("--context", type=int, default=120)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per variant per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="XLA intra-op threads")
    args = ap.parse_args(argv)

    from splitserve.engine.compile.jax_setup import configure_jax_runtime

    configure_jax_runtime(cpu_threads=args.threads)
    import numpy as np

    from splitserve.engine import resolve_model_path
    from splitserve.engine.interface import SamplingParams
    from splitserve.engine.jax.engine import JaxEngine
    from splitserve.engine.kernels import quant
    from splitserve.engine.model.model_files import load_model, load_native

    path = resolve_model_path(args.model)
    cfg, weights = load_model(path)
    native = load_native(path, cfg)
    greedy = SamplingParams()
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(3, cfg.vocab_size, args.context)]
    runs = {}
    for text in args.variants:
        fmt, live, steps, attention, slots, huge_pages = parse_variant(text, args.slots)
        t = time.perf_counter()
        xla = fmt == XLA_FLOAT32  # float32 with no kernel rows at any batch
        engine = JaxEngine(
            cfg, weights, slots, args.capacity, prefill_buckets=(args.capacity,),
            decode_buckets=(args.capacity,), weight_format="float32" if xla else fmt,
            float32_rows_max_batch=0 if xla else quant.ROWS_MAX_BATCH, native=native,
            decode_steps=(steps,), attention=attention, huge_pages=huge_pages,
        )
        prefix = engine.prefill(prompt, greedy)
        runs[text] = (engine, prefix, live, steps)
        fill(engine, prefix, live)
        step(engine, steps)  # compiles this variant's program
        print(f"built {text} in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    wall: dict[str, list[float]] = {v: [] for v in runs}
    cpu: dict[str, list[float]] = {v: [] for v in runs}
    for _ in range(args.rounds):
        for text, (engine, prefix, live, steps) in runs.items():
            fill(engine, prefix, live)
            w, c = [], []
            for _ in range(args.steps):
                t0, c0 = time.perf_counter(), time.process_time()
                step(engine, steps)
                w.append((time.perf_counter() - t0) / steps)
                c.append((time.process_time() - c0) / steps)
            wall[text].append(statistics.median(w))
            cpu[text].append(statistics.median(c))
    first = args.variants[0]
    w0, c0 = statistics.median(wall[first]), statistics.median(cpu[first])
    print(f"model {os.path.basename(path)}, {args.slots} slots unless named, capacity "
          f"{args.capacity}, context ~{args.context}, {args.threads} XLA thread(s), "
          f"{args.rounds} rounds x {args.steps} steps")
    print("| variant | step ms (wall) | ratio | step ms (CPU) | ratio |")
    print("|---|---|---|---|---|")
    for text in runs:
        w, c = statistics.median(wall[text]), statistics.median(cpu[text])
        print(f"| {text} | {w * 1e3:.1f} | {w / w0:.2f} | {c * 1e3:.1f} | {c / c0:.2f} |")


def fill(engine, prefix, live: int) -> None:
    from splitserve.engine.interface import SamplingParams

    for slot in range(engine.num_slots):
        engine.free(slot)
    for slot in range(live):
        engine.insert(prefix, slot, SamplingParams())


def step(engine, steps: int) -> None:
    if steps == 1:
        engine.generate()
    else:
        engine.generate_many(steps)


if __name__ == "__main__":
    main()
