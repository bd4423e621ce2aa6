"""The suite's sections: one model and load each, served in each mode, and their quick versions
(small sizes for a short run)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from splitserve.bench.runner import BenchSettings

MODES = ("processes", "threads")
DETOK_STOPS = ("<|stop|>", "\u00bfFIN?", "\u7d42\u308f\u308a", "\U0001f6d1 end", "zzzq")


@dataclass(frozen=True)
class Section:
    """One model and load, served in each of `modes`, optionally against the engine ceiling."""

    key: str
    title: str
    engine: str
    model: str
    tokenizer: str
    slots: int
    max_seq_len: int
    concurrencies: tuple[int, ...]
    num_requests: tuple[int, ...]
    prompt_tokens: int
    output_tokens: int
    output_spread: float = 0.0  # each request's output within +/- this fraction of the mean
    modes: tuple[str, ...] = MODES
    stop: tuple[str, ...] = ()
    unicode_prompts: bool = False
    max_running: int = 64
    cpu_threads: int = 0  # XLA threads per served engine process (0: one per CPU)
    # processes mode: the decode worker owns a CPU (see cpu_layout), for engines that run one
    # XLA thread; a bigger model's decode step wants every CPU, as in threads mode
    pin_roles: bool = True
    ceiling: bool = True
    ceiling_steps: int = 200
    ready_timeout_s: float = 900.0
    notes: str = ""

    @property
    def context(self) -> int:
        """The context the ceiling runs at. The engine's step costs what its cache capacity
        holds, and the capacity follows the longest live sequence: with outputs of one length,
        prompt plus half the output (the mean), whose bucket a run spends most steps in; with
        varied outputs, the longest request's, as some live stream is near it at any time."""
        if self.output_spread:
            longest = round(self.output_tokens * (1 + self.output_spread))
            return self.prompt_tokens + longest - 32  # the ceiling adds up to 32 as it runs
        return self.prompt_tokens + self.output_tokens // 2



def sections(quick: bool, tok8000: str, smollm2: str | None) -> list[Section]:
    tiny = Section(
        key="tiny",
        title="tiny-7m: served throughput against the engine ceiling",
        engine="jax",
        model="random:tiny-7m",
        tokenizer=tok8000,
        slots=16,
        max_seq_len=512,
        concurrencies=(1, 16, 64, 128),
        num_requests=(24, 64, 128, 256),  # c=1: enough requests for a steady median TTFT
        prompt_tokens=128,
        output_tokens=128,  # the targets' reference load: 16 streams of 128 output tokens
        cpu_threads=1,  # a second XLA thread gains nothing on the 7M shape; the stack needs it
    )
    detok = Section(
        key="detok",
        title="Detokenization-heavy load (tiny-7m, 128 streams, stop strings, UTF-8)",
        engine="jax",
        model="random:tiny-7m",
        tokenizer=tok8000,
        slots=128,
        max_seq_len=1024,
        concurrencies=(128,),
        # five requests per stream, of varied length: past the first wave, streams start and
        # end at different steps, as under real traffic, instead of all in lockstep
        num_requests=(640,),
        prompt_tokens=64,
        output_tokens=512,
        output_spread=0.25,
        stop=DETOK_STOPS,
        unicode_prompts=True,
        max_running=128,
        ceiling_steps=300,  # enough steps for the engine's own p99
        cpu_threads=1,
    )
    fake = Section(
        key="fake",
        title="Fake engine: the serving pipeline alone",
        engine="fake",
        model="fake",
        tokenizer=tok8000,
        slots=128,
        max_seq_len=512,
        concurrencies=(1, 16, 64, 128),
        num_requests=(8, 64, 128, 256),
        prompt_tokens=128,
        output_tokens=128,
        max_running=128,
        ceiling=False,
        notes="No model compute: each decode step costs only the worker's own Python, so these "
        "figures bound what the pipeline can deliver whatever the engine.",
    )
    out = [tiny, detok, fake]
    if smollm2:
        out.append(
            Section(
                key="smollm2",
                title="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
                engine="jax",
                model=smollm2,
                tokenizer=smollm2,
                slots=16,
                max_seq_len=256,
                concurrencies=(1, 16, 64, 128),
                num_requests=(4, 16, 64, 128),
                prompt_tokens=64,
                output_tokens=32,
                ceiling_steps=40,
                pin_roles=False,  # 30 layers: two XLA threads make its step about 25% shorter
            )
        )
    if quick:
        out = [quick_version(s) for s in out]
    return out


def quick_version(s: Section) -> Section:
    """Small sizes for a short run: fewer and shorter requests, lower concurrency."""
    if s.key == "detok":
        return replace(s, slots=64, max_running=64, concurrencies=(64,), num_requests=(128,),
                       output_tokens=128, max_seq_len=512, ceiling_steps=40,
                       title=s.title.replace("128 streams", "64 streams"))  # fmt: skip
    if s.key == "smollm2":
        return replace(s, concurrencies=(1, 16), num_requests=(2, 16), output_tokens=16,
                       prompt_tokens=32, modes=("processes",), ceiling_steps=20)  # fmt: skip
    return replace(s, concurrencies=(1, 16, 64), num_requests=(4, 32, 64),
                   output_tokens=min(s.output_tokens, 32), ceiling_steps=60)  # fmt: skip


def bench_settings(s: Section, url: str, load: int, warmup: bool) -> BenchSettings:
    """The section's load number `load` alone (the ceiling is measured between loads)."""
    return BenchSettings(
        url=url,
        concurrencies=(s.concurrencies[load],),
        num_requests=(s.num_requests[load],),
        prompt_tokens=s.prompt_tokens,
        output_tokens=s.output_tokens,
        output_spread=s.output_spread,
        stop=s.stop,
        unicode_prompts=s.unicode_prompts,
        tokenizer=s.tokenizer,
        warmup_requests=2 if warmup else 0,
        request_timeout_s=300.0,
        progress=False,
    )
