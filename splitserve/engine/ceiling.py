"""The engine's own ceiling: the decode step in a tight loop and the prefill pass, no serving.

Served throughput is judged against these figures. Run as a script:

    python -m splitserve.engine.ceiling --model random:tiny-7m --slots 16 --context 160

Every slot holds a sequence of about `context` tokens: all slots are refilled every
`refill_every` steps (untimed) so the attended length stays near `context` instead of
drifting upward over a long run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from splitserve.engine.interface import Engine, SamplingParams
from splitserve.stats import quantiles


def _summary(times: list[float]) -> dict[str, float]:
    p50, p10, p90, p99 = quantiles(times, (0.5, 0.1, 0.9, 0.99))
    return {
        "p50": p50, "p10": p10, "p90": p90, "p99": p99,
        "min": min(times), "mean": statistics.fmean(times),
    }  # fmt: skip


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, n)]


def measure_decode_ceiling(
    engine: Engine,
    context_len: int,
    steps: int,
    *,
    sampling: SamplingParams | None = None,
    refill_every: int = 32,
    warm_steps: int = 3,
) -> dict:
    """Fill every slot with a ~context_len prefix, time `steps` generate() calls.

    Returns step_s (p50/p10/p90/min/mean seconds), tokens_per_s and the settings. One prefill
    serves all slots (insert copies it into each).

    tokens_per_s is the loop's own rate, slots / mean step: tokens made over the time it took,
    the same kind of figure as a served run's tokens/s, which its slower steps count in too.
    slots / median step (tokens_per_s_p50) leaves those steps out, so it overstates what the
    engine alone sustains by as much as its step time is skewed (3% on the 2-core host).
    """
    sampling = sampling or SamplingParams()
    slots = engine.num_slots
    span = max(1, min(refill_every, engine.max_seq_len - context_len - 1))
    prefix = engine.prefill(_prompt(context_len, engine.vocab_size, 0), sampling)

    def refill() -> None:
        for slot in range(slots):
            engine.insert(prefix, slot, SamplingParams(
                sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed + slot))
        engine.generate()  # untimed: absorbs any cache resize after the refill

    refill()
    for _ in range(warm_steps):
        engine.generate()
    times: list[float] = []
    done_since_refill = span  # refill before the first timed step
    while len(times) < steps:
        if done_since_refill >= span - 1:
            refill()
            done_since_refill = 0
        t = time.perf_counter()
        engine.generate()  # returns host arrays: the step has finished
        times.append(time.perf_counter() - t)
        done_since_refill += 1
    for slot in range(slots):
        engine.free(slot)
    step = _summary(times)
    return {
        "slots": slots,
        "context_len": context_len,
        "steps": steps,
        "greedy": sampling.temperature == 0,
        "step_s": step,
        "tokens_per_s": slots / step["mean"],
        "tokens_per_s_p50": slots / step["p50"],
    }


def measure_prefill(
    engine: Engine, prompt_len: int, repeats: int = 30, idle_s: float = 0.0
) -> dict:
    """Time prefill of a prompt_len-token prompt (after one untimed call that warms it).

    prefill_s is back to back, one prefill right after another: the engine at its quickest.
    With idle_s > 0, as many more prefills follow, each after idle_s of sleep
    (prefill_after_idle_s): the way a request meets a prefill worker at concurrency 1, where
    the previous one ended a whole decode earlier. On the shared 2-core host such a prefill
    ran 0.5-4 ms slower (from run to run), with no serving involved; the engine regains its
    back-to-back speed only over several prefills in a row, so the two kinds are not
    interleaved: that would time neither.
    """
    engine.prefill(_prompt(prompt_len, engine.vocab_size, 1), SamplingParams())

    def timed(seed: int) -> float:
        prompt = _prompt(prompt_len, engine.vocab_size, seed)
        t = time.perf_counter()
        engine.prefill(prompt, SamplingParams())
        return time.perf_counter() - t

    times = [timed(2 + i) for i in range(repeats)]
    after_idle = []
    for i in range(repeats if idle_s > 0 else 0):
        time.sleep(idle_s)
        after_idle.append(timed(2 + repeats + i))
    summary = _summary(times)
    out = {
        "prompt_len": prompt_len,
        "prefill_s": summary,
        "tokens_per_s": prompt_len / summary["p50"],
    }
    if after_idle:
        out["idle_s"] = idle_s
        out["prefill_after_idle_s"] = _summary(after_idle)
    return out


def main(argv: list[str] | None = None) -> None:
    from splitserve.engine.jax_engine import build_jax_engine
    from splitserve.engine.jax_setup import configure_jax_runtime, enable_compilation_cache

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:tiny-7m",
                    help="random:<preset>[:seed], a .gguf file, a HF folder, or 'default'")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=128, help="prefill prompt length")
    ap.add_argument("--prefill-idle-ms", type=float, default=0.0,
                    help="also time as many prefills again, each after this much idle time")
    ap.add_argument("--temperature", type=float, default=0.0, help=">0: the sampling path")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="XLA intra-op threads (default: one per CPU)")
    ap.add_argument("--compile-cache", default=None, help="persistent compilation cache dir")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    configure_jax_runtime(cpu_threads=args.cpu_threads)
    if args.compile_cache:
        enable_compilation_cache(args.compile_cache)
    model = args.model
    if model == "default":
        from splitserve.engine.default_model import default_model_path

        model = default_model_path()
    t = time.perf_counter()
    engine = build_jax_engine(model, args.slots, args.max_seq_len)
    built = time.perf_counter() - t
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, seed=1)
    decode = measure_decode_ceiling(engine, args.context, args.steps, sampling=sampling)
    prefill = measure_prefill(engine, args.prompt, idle_s=args.prefill_idle_ms / 1e3)
    if args.json:
        print(json.dumps({"model": args.model, "build_s": built, "decode": decode,
                          "prefill": prefill}))
        return
    step = decode["step_s"]
    print(f"model {args.model}: {engine.cfg.num_params() / 1e6:.1f}M params, built in "
          f"{built:.1f}s")
    print(f"decode  slots={args.slots} context~{args.context}: step p50 "
          f"{step['p50'] * 1e3:.2f} ms (p10 {step['p10'] * 1e3:.2f}, p90 "
          f"{step['p90'] * 1e3:.2f}, mean {step['mean'] * 1e3:.2f}) -> "
          f"{decode['tokens_per_s']:.0f} tokens/s")
    pre = prefill["prefill_s"]
    print(f"prefill {args.prompt} tokens: p50 {pre['p50'] * 1e3:.1f} ms "
          f"(min {pre['min'] * 1e3:.1f}) -> {prefill['tokens_per_s']:.0f} tokens/s")
    idle = prefill.get("prefill_after_idle_s")
    if idle:
        print(f"prefill {args.prompt} tokens after {args.prefill_idle_ms:.0f} ms idle: p50 "
              f"{idle['p50'] * 1e3:.1f} ms (min {idle['min'] * 1e3:.1f}), "
              f"{(idle['p50'] - pre['p50']) * 1e3:+.1f} ms against back to back")


if __name__ == "__main__":
    main()
