"""One benchmark end to end: for each load (a concurrency or a rate), read /metrics, send the
requests, read /metrics again, and summarize. `splitserve bench` and the lab's suite (lab/suite/)
call this.

1. Check the endpoint answers (/health) and send a few warm-up requests (not measured).
2. Per load: scrape /metrics, run the load with a progress bar, wait one heartbeat or two so
   the decode worker's latest histograms reach the router, scrape again.
3. Summarize client figures (stats.py) and the server's step figures (scrape.py) per load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
from tqdm import tqdm

from splitserve.bench import scrape
from splitserve.bench.client import ConnectionPool, Endpoint, RequestResult, stream_completion
from splitserve.bench.load import LoadSpec, run_load
from splitserve.bench.prompts import PromptFactory
from splitserve.bench.stats import summarize


@dataclass(frozen=True)
class BenchSettings:
    url: str = "http://127.0.0.1:8000"
    model: str | None = None
    # "completions" (/v1/completions, the prompt as text) or "chat" (/v1/chat/completions, the
    # prompt as one user message, through the model's chat template: the path users take)
    endpoint: str = "completions"
    concurrencies: tuple[int, ...] = (1,)
    rates: tuple[float, ...] = ()  # when given: Poisson loads; concurrencies[0] caps in-flight
    num_requests: tuple[int, ...] = (32,)  # one value, or one per load
    prompt_tokens: int = 128
    output_tokens: int = 64
    # each request's max_tokens uniform in output_tokens * [1 - spread, 1 + spread]: requests
    # of a closed loop then end at different times, as real ones do, instead of in lockstep
    output_spread: float = 0.0
    stop: tuple[str, ...] = ()
    unicode_prompts: bool = False
    tokenizer: str | None = None
    temperature: float = 0.0
    seed: int = 0
    warmup_requests: int = 2
    request_timeout_s: float = 600.0
    api_key: str | None = None
    progress: bool = True
    metrics: bool = True
    metrics_settle_s: float = 0.6  # > 2 heartbeat intervals: the last steps reach /metrics

    def loads(self) -> list[LoadSpec]:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"--endpoint must be completions or chat, not {self.endpoint!r}")
        if not 0.0 <= self.output_spread < 1.0:
            raise ValueError(f"--output-spread must be in [0, 1), not {self.output_spread}")
        if self.rates:
            cap = self.concurrencies[0] if self.concurrencies else None
            specs: list[tuple[int | None, float | None]] = [(cap, r) for r in self.rates]
        else:
            specs = [(c, None) for c in self.concurrencies]
        if len(self.num_requests) not in (1, len(specs)):
            raise ValueError(f"give one --num-requests or one per load ({len(specs)})")
        counts = self.num_requests
        if len(counts) == 1:
            counts = counts * len(specs)
        return [
            LoadSpec(num_requests=n, concurrency=c, rate=r, seed=self.seed)
            for (c, r), n in zip(specs, counts, strict=True)
        ]


def output_length(settings: BenchSettings, index: int) -> int:
    """Request `index`'s max_tokens: output_tokens, or drawn around it (same seed, same draw)."""
    spread = settings.output_spread
    if not spread:
        return settings.output_tokens
    u = random.Random(f"{settings.seed}:{index}").uniform(1.0 - spread, 1.0 + spread)
    return max(1, round(settings.output_tokens * u))


def payload(settings: BenchSettings, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": settings.temperature,
    }
    if settings.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if settings.model:
        body["model"] = settings.model
    if settings.stop:
        body["stop"] = list(settings.stop)
    return body


def check_endpoint(url: str, timeout_s: float = 10.0) -> None:
    """Raise a clear error when nothing healthy answers at url."""
    try:
        resp = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ConnectionError(f"no server at {url}: {exc}") from None
    if resp.status_code != 200:
        raise ConnectionError(f"{url}/health answered {resp.status_code}: {resp.text[:200]}")


def run_benchmark(settings: BenchSettings, check: bool = True) -> dict[str, Any]:
    """Run every load of settings; the report dict (see report.py)."""
    if check:
        check_endpoint(settings.url)
    tokenizer = None
    if settings.tokenizer:
        from splitserve.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(settings.tokenizer)
    prompts = PromptFactory(
        settings.prompt_tokens, settings.unicode_prompts, tokenizer, seed=settings.seed
    )
    report: dict[str, Any] = {
        "settings": dataclasses.asdict(settings) | {"api_key": bool(settings.api_key)},
        "runs": [],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    settings.loads()  # validates the loads before anything is sent
    asyncio.run(_warm_up(settings, prompts))
    offset = 1_000_000  # prompt indexes: each load draws its own prompts
    for spec in settings.loads():
        report["runs"].append(_run_one(settings, spec, prompts, offset))
        offset += spec.num_requests
    return report


async def _warm_up(settings: BenchSettings, prompts: PromptFactory) -> None:
    endpoint = Endpoint.parse(settings.url)
    for i in range(settings.warmup_requests):
        body = payload(settings, prompts.prompt(i), min(settings.output_tokens, 8))
        r = await stream_completion(
            endpoint, body, i, settings.api_key, settings.request_timeout_s, api=settings.endpoint
        )
        if not r.ok:
            raise ConnectionError(f"warm-up request failed: {r.error}")


def _run_one(
    settings: BenchSettings, spec: LoadSpec, prompts: PromptFactory, offset: int
) -> dict[str, Any]:
    endpoint = Endpoint.parse(settings.url)
    bodies = [
        payload(settings, prompts.prompt(offset + i), output_length(settings, offset + i))
        for i in range(spec.num_requests)
    ]
    before = scrape.scrape(settings.url, api_key=settings.api_key) if settings.metrics else None
    bar = tqdm(total=spec.num_requests, desc=spec.label, unit="req", disable=not settings.progress)

    # One pool of keep-alive connections per run, as a real client keeps its connections: a
    # closed loop of N requests in flight holds about N of them (see client.py).
    pool = ConnectionPool(endpoint)

    async def send(index: int) -> RequestResult:
        body, key, timeout_s = bodies[index], settings.api_key, settings.request_timeout_s
        return await stream_completion(
            endpoint, body, index, key, timeout_s, pool=pool, api=settings.endpoint
        )

    def done(r: RequestResult) -> None:
        bar.update(1)
        if not r.ok:
            bar.set_postfix_str(f"failed: {r.error}"[:60], refresh=False)

    async def load() -> tuple[list[RequestResult], float]:
        try:
            return await run_load(spec, send, done)
        finally:
            pool.close()  # in this loop, which its connections belong to

    try:
        results, duration = asyncio.run(load())
    finally:
        bar.close()
    after = None
    if settings.metrics:
        time.sleep(settings.metrics_settle_s)
        after = scrape.scrape(settings.url, api_key=settings.api_key)
    run = {
        "label": spec.label,
        "concurrency": spec.concurrency,
        "rate": spec.rate,
        "num_requests": spec.num_requests,
        **summarize(results, duration),
        "server": scrape.server_figures(before, after) if settings.metrics else None,
    }
    ok = [r for r in results if r.ok]
    run["_samples"] = {
        "ttft_s": [r.ttft for r in ok if r.ttft is not None],
        "e2e_s": [r.e2e for r in ok if r.e2e is not None],
        "itl_s": [
            b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)
        ],
    }
    return run


def compare_to_ceiling(report: dict[str, Any], ceiling: dict[str, Any]) -> None:
    """Add each run's steady output tokens/s (the whole run's when that is undefined) as a
    fraction of the engine ceiling's tokens/s: a tight loop has no ramp-up nor tail either."""
    report["ceiling"] = ceiling
    for run in report["runs"]:
        run["fraction_of_ceiling"] = fraction_of_ceiling(run, ceiling)


def fraction_of_ceiling(run: dict[str, Any], ceiling: dict[str, Any] | None) -> float | None:
    tps = (ceiling or {}).get("tokens_per_s")
    served = run.get("steady_output_tokens_per_s")
    if served is None or served != served:  # NaN
        served = run.get("output_tokens_per_s")
    return served / tps if tps and served == served else None
