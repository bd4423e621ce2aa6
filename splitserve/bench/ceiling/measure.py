"""The measurement of the engine's own ceiling: the decode step in a tight loop and the prefill
pass, through the Engine interface alone (no serving). Served throughput is judged against these
figures; `splitserve bench --ceiling` runs them (probe.py builds the engine).

Every slot holds a sequence of about `context` tokens: all slots are refilled every
`refill_every` steps (untimed) so the attended length stays near `context` instead of
drifting upward over a long run.
"""

from __future__ import annotations

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

    Returns step_s (p50/p10/p90/p99/min/mean seconds), tokens_per_s and the settings. One prefill
    serves all slots (insert copies it into each).

    tokens_per_s is the loop's own rate, slots / mean step: tokens made over the time it took,
    the same kind of figure as a served run's tokens/s, which its slower steps count in too.
    slots / median step (tokens_per_s_p50) leaves those steps out, so it overstates what the
    engine alone sustains by as much as its step time is skewed.
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
    the previous one ended a whole decode earlier. Such a prefill runs slower, by an amount that
    varies from run to run, with no serving involved; the engine regains its
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
