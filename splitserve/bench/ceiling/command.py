"""`splitserve bench --ceiling`: the options and the command (`--probe`: measure once per line
read from stdin, for the suite's child process)."""

from __future__ import annotations

import argparse
import os
import sys

from splitserve.bench import report
from splitserve.bench.ceiling.probe import CeilingProbe, CeilingSettings
from splitserve.engine.interface import SamplingParams


def add_ceiling_args(p: argparse.ArgumentParser) -> None:
    """The ceiling's own options; it also reads --model, --prompt-tokens, --temperature,
    --out-json and --out-md of the bench's parser."""
    g = p.add_argument_group("--ceiling: the engine alone")
    g.add_argument("--ceiling", action="store_true")
    g.add_argument("--probe", action="store_true",
                   help="build once, then measure again for each line read from stdin, one JSON "
                        "line each (a suite measures the ceiling between its loads this way)")
    g.add_argument("--engine", choices=["jax", "fake"], default="jax")
    g.add_argument("--slots", type=int, default=16)
    g.add_argument("--context", type=int, default=160, help="attended length per slot")
    g.add_argument("--steps", type=int, default=200)
    g.add_argument("--max-seq-len", type=int, default=2048, help="as the server's")
    g.add_argument("--vocab-size", type=int, default=8000, help="fake engine only")
    g.add_argument("--top-p", type=float, default=1.0, help="with --temperature > 0")
    g.add_argument("--top-k", type=int, default=0, help="with --temperature > 0")
    g.add_argument("--cpu-threads", type=int, default=0,
                   help="XLA intra-op threads (default: one per CPU)")
    g.add_argument("--prefill-idle-ms", type=float, default=0.0,
                   help="also time as many prefills again, each after this much idle time: "
                        "the way a request meets a prefill worker at concurrency 1")
    g.add_argument("--compile-cache", default=os.path.join(
        os.path.expanduser("~"), ".cache", "splitserve", "jax"))  # fmt: skip


def ceiling_main(args: argparse.Namespace) -> int:
    probe = CeilingProbe(CeilingSettings(
        model=args.model or "default",
        slots=args.slots,
        context=args.context,
        steps=args.steps,
        prompt_tokens=args.prompt_tokens,
        max_seq_len=args.max_seq_len,
        engine=args.engine,
        vocab_size=args.vocab_size,
        compile_cache_dir=args.compile_cache,
        cpu_threads=args.cpu_threads,
        sampling=SamplingParams(args.temperature, args.top_p, args.top_k),
        prefill_idle_s=args.prefill_idle_ms / 1e3,
    ))  # fmt: skip
    if args.probe:
        probe.serve(sys.stdin, sys.stdout)
        return 0
    result = probe.measure()
    print(report.ceiling_table([result]))
    idle, back_to_back = result.get("prefill_after_idle_s"), result["prefill_s"]
    if idle:
        print(f"prefill {args.prompt_tokens} tokens after {args.prefill_idle_ms:.0f} ms idle: p50 "
              f"{idle['p50'] * 1e3:.1f} ms (min {idle['min'] * 1e3:.1f}), "
              f"{(idle['p50'] - back_to_back['p50']) * 1e3:+.1f} ms against back to back")
    if args.out_json:
        report.write_json(result, args.out_json)
    if args.out_md:
        report.write_markdown("# Engine ceiling\n\n" + report.ceiling_table([result]), args.out_md)
    return 0
