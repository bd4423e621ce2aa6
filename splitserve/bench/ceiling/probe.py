"""The engine built exactly as a worker builds it (splitserve.engine.build_engine, same slots and
max_seq_len, so the same compiled shapes), then measured (measure.py) as often as asked, with
the settings and the host recorded next to the figures.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from typing import IO, Any

from splitserve.bench.ceiling import measure
from splitserve.config import ModelConfig
from splitserve.engine.interface import SamplingParams


@dataclass(frozen=True)
class CeilingSettings:
    model: str
    slots: int
    context: int
    steps: int = 200
    prompt_tokens: int = 128
    max_seq_len: int = 2048
    engine: str = "jax"
    vocab_size: int = 8000  # the fake engine's
    compile_cache_dir: str = ""
    cpu_threads: int = 0  # XLA threads, as model.cpu_threads (0: one per CPU)
    sampling: SamplingParams = SamplingParams()  # greedy unless told
    # > 0: also time as many prefills again, each after this much idle time (measure_prefill)
    prefill_idle_s: float = 0.0


class CeilingProbe:
    """A benchmark suite measures the ceiling between its served loads, seconds apart, without
    paying the build each time.

    measure() returns the settings plus tokens_per_s (slots / mean step: the loop's own rate;
    slots / median step as tokens_per_s_p50), step_s and prefill_s (distributions in seconds:
    p50, p10, p90, p99, min, mean) and build_s.
    """

    def __init__(self, settings: CeilingSettings):
        s = settings
        if s.context >= s.max_seq_len or s.prompt_tokens >= s.max_seq_len:
            raise ValueError(
                f"context {s.context} and prompt {s.prompt_tokens} must fit {s.max_seq_len}"
            )
        from splitserve.engine import build_engine

        config = ModelConfig(
            engine=s.engine,
            path=s.model,
            num_slots=s.slots,
            max_seq_len=s.max_seq_len,
            compile_cache_dir=s.compile_cache_dir,
            cpu_threads=s.cpu_threads,
        )
        t0 = time.perf_counter()
        self.engine = build_engine(config, s.vocab_size)
        self.options = s
        recorded = ("model", "engine", "slots", "context", "steps", "prompt_tokens", "max_seq_len")
        self.settings: dict[str, Any] = {k: getattr(s, k) for k in recorded}
        self.settings["build_s"] = time.perf_counter() - t0
        if s.sampling != SamplingParams():
            self.settings["sampling"] = {"temperature": s.sampling.temperature,
                                         "top_p": s.sampling.top_p, "top_k": s.sampling.top_k}

    def measure(self) -> dict[str, Any]:
        s = self.options
        decode = measure.measure_decode_ceiling(
            self.engine, s.context, s.steps, sampling=s.sampling
        )
        prefill = measure.measure_prefill(self.engine, s.prompt_tokens, idle_s=s.prefill_idle_s)
        out = {
            **self.settings,
            "tokens_per_s": decode["tokens_per_s"],
            "tokens_per_s_p50": decode["tokens_per_s_p50"],
            "step_s": decode["step_s"],
            "prefill_s": prefill["prefill_s"],
            "source": "splitserve.bench.ceiling",
            "host": _host(s.engine),
            "measured_at": time.time(),
        }
        if "prefill_after_idle_s" in prefill:
            out["prefill_idle_s"] = prefill["idle_s"]
            out["prefill_after_idle_s"] = prefill["prefill_after_idle_s"]
        return out

    def serve(self, commands: IO[str], out: IO[str]) -> None:
        """One measurement, printed as one JSON line, per line read from `commands`, until
        they end."""
        for _ in commands:
            out.write(json.dumps(self.measure()) + "\n")
            out.flush()


def _host(engine: str) -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "machine": platform.machine()}
    if engine == "jax":
        import jax

        info["jax_backend"] = jax.default_backend()
        info["jax_devices"] = [str(d) for d in jax.devices()]
    return info
