"""`--ceiling`: the engine alone, no serving: the decode step in a tight loop at a slot count and
context length (every slot live), and bare prefill at the prompt length. Served throughput is
measured against its tokens/s; time to first token at concurrency 1 against its prefill time.

The measurement is the engine package's (splitserve.engine.ceiling); this module builds the
engine exactly as a worker does (splitserve.engine.build_engine, same slots and max_seq_len, so
the same compiled shapes) and records the settings and host next to the figures.
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import IO, Any

from splitserve.config import ModelConfig
from splitserve.engine import ceiling as engine_ceiling


class CeilingProbe:
    """The engine built as a worker builds it, then measured (decode and prefill) as often as
    asked: a benchmark suite measures the ceiling between its served loads, seconds apart,
    without paying the build each time.

    measure() returns the settings plus tokens_per_s (slots / mean step: the loop's own rate;
    slots / median step as tokens_per_s_p50), step_s and prefill_s (distributions in seconds:
    p50, p10, p90, min, mean) and build_s.
    """

    def __init__(
        self,
        model: str,
        slots: int,
        context: int,
        steps: int = 200,
        prompt_tokens: int = 128,
        max_seq_len: int = 2048,
        engine: str = "jax",
        vocab_size: int = 8000,
        compile_cache_dir: str = "",
    ):
        if context >= max_seq_len or prompt_tokens >= max_seq_len:
            raise ValueError(
                f"context {context} and prompt {prompt_tokens} must fit {max_seq_len}"
            )
        from splitserve.engine import build_engine

        if engine == "jax":
            from splitserve.engine.jax_setup import configure_jax_runtime

            configure_jax_runtime()
        config = ModelConfig(
            engine=engine,
            path=model,
            num_slots=slots,
            max_seq_len=max_seq_len,
            compile_cache_dir=compile_cache_dir,
        )
        t0 = time.perf_counter()
        self.engine = build_engine(config, vocab_size)
        self.settings = {
            "model": model,
            "engine": engine,
            "slots": slots,
            "context": context,
            "steps": steps,
            "prompt_tokens": prompt_tokens,
            "max_seq_len": max_seq_len,
            "build_s": time.perf_counter() - t0,
        }

    def measure(self) -> dict[str, Any]:
        s = self.settings
        decode = engine_ceiling.measure_decode_ceiling(self.engine, s["context"], s["steps"])
        prefill = engine_ceiling.measure_prefill(self.engine, s["prompt_tokens"])
        return {
            **s,
            "tokens_per_s": decode["tokens_per_s"],
            "tokens_per_s_p50": decode["tokens_per_s_p50"],
            "step_s": decode["step_s"],
            "prefill_s": prefill["prefill_s"],
            "source": "splitserve.engine.ceiling",
            "host": _host(s["engine"]),
            "measured_at": time.time(),
        }

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
