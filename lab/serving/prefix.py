"""Prefix-cache benchmark (not a test): what reusing a shared prompt beginning buys.

1. Cache on vs off, on the real model: every request is one 1,024-token system prompt shared by
   all, then a 32-token user turn of its own, streamed from /v1/completions (as token ids, so
   the lengths are exact). Time to first token at concurrency 1 and served output tokens/s at
   concurrency 16, each on a fresh stack (cache off, then on).
2. Prefix-aware placement vs load alone, with 2 prefill workers of the fake engine (its prefill
   sleeps fake_prefill_s for a whole prompt, the uncached share of it for a cached one): 8
   system prompts of 1,024 tokens in turn, each worker's cache big enough for about 5 of them,
   so where a prompt goes decides whether its prefix is there.

    .venv/bin/python -m lab.serving.prefix --out-json prefix.json   # both parts
    .venv/bin/python -m lab.serving.prefix --part placement         # the fake one only

Figures are medians and ratios from one run; the machine is shared, so expect noise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import random
import statistics
import tempfile
import time
from typing import Any

import httpx

from splitserve.config import config_from_dict
from splitserve.launch.health import every_worker_ready, health_url, wait_ready
from splitserve.launch.ports import free_port
from splitserve.launch.processes import ProcessStack
from splitserve.launch.roles import write_config
from splitserve.tokenizers.synthetic import build_synthetic_tokenizer

log = logging.getLogger(__name__)

SYSTEM_TOKENS = 1024
USER_TOKENS = 32


def start_stack(raw: dict[str, Any], work: str, name: str) -> tuple[ProcessStack, str]:
    port = free_port()
    raw = {**raw, "router": {"port": port, "max_running": 64, "max_queued": 1024,
                             "queue_timeout_s": 600.0, **raw.get("router", {})}}  # fmt: skip
    raw["cluster"] = {**raw.get("cluster", {}), "run_dir": tempfile.mkdtemp(prefix="ss-pfx-")}
    config = config_from_dict(raw)
    stack = ProcessStack(config, log_dir=os.path.join(work, name),
                         config_path=write_config(config))  # fmt: skip
    stack.start()
    wait_ready(health_url(config), 3600, stack=stack, ready=every_worker_ready)
    return stack, f"http://127.0.0.1:{port}"


def one_request(url: str, ids: list[int], max_tokens: int) -> dict[str, float]:
    """Stream one completion: its time to first token, output tokens and cached tokens."""
    body = {"prompt": ids, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and ttft is None:
                ttft = time.perf_counter() - start
            usage = event.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return {"ttft_s": ttft or 0.0, "tokens": usage.get("completion_tokens", 0),
            "cached": details.get("cached_tokens", 0), "end_s": time.perf_counter() - start}


def load(url: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    """Every prompt once, `concurrency` in flight: median TTFT, served output tokens/s."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        runs = list(pool.map(lambda p: one_request(url, p, max_tokens), prompts))
    wall = time.perf_counter() - start
    return {
        "concurrency": concurrency, "requests": len(runs),
        "ttft_median_s": statistics.median(r["ttft_s"] for r in runs),
        "tokens_per_s": sum(r["tokens"] for r in runs) / wall,
        "cached_tokens_median": statistics.median(r["cached"] for r in runs),
    }  # fmt: skip


def turns(rng: random.Random, systems: list[list[int]], n: int, lo: int, hi: int) -> list:
    """n prompts: the systems in turn, each with a fresh user turn of USER_TOKENS ids."""
    return [systems[i % len(systems)] + [rng.randrange(lo, hi) for _ in range(USER_TOKENS)]
            for i in range(n)]  # fmt: skip


def cache_part(args: argparse.Namespace, work: str) -> list[dict]:
    rng = random.Random(0)
    lo, hi = 1000, 40000  # ordinary ids of the default model's 49,152
    system = [rng.randrange(lo, hi) for _ in range(SYSTEM_TOKENS)]
    model = {"engine": "jax", "path": args.model, "num_slots": 16, "max_seq_len": 1152,
             "prefill_buckets": [64, 1152]}  # fmt: skip
    rows = []
    for cache in (False, True):
        stack, url = start_stack({"model": {**model, "prefix_cache": cache}}, work,
                                 f"cache-{cache}")  # fmt: skip
        try:
            for p in turns(rng, [system], 2, lo, hi):  # warm-up, and the prefix cached
                one_request(url, p, 4)
            for c, n in ((1, args.requests_c1), (16, args.requests_c16)):
                row = load(url, turns(rng, [system], n, lo, hi), c, args.output_tokens)
                rows.append({"cache": cache, **row})
                log.warning("cache %s: %s", cache, row)
        finally:
            stack.stop(timeout_s=60)
    return rows


def placement_part(args: argparse.Namespace, work: str) -> list[dict]:
    rng = random.Random(1)
    tokenizer = build_synthetic_tokenizer(os.path.join(work, "tok"), 512)
    systems = [[rng.randrange(3, 500) for _ in range(SYSTEM_TOKENS)] for _ in range(8)]
    # 4 bytes a token (the fake's KV): 5 system prompts and change per worker
    bound_mb = 5.5 * SYSTEM_TOKENS * 4 / 2**20
    model = {"engine": "fake", "tokenizer": tokenizer, "num_slots": 32, "max_seq_len": 2048,
             "fake_prefill_s": args.fake_prefill_s, "fake_step_s": 0.01,
             "prefix_cache_mb": bound_mb}  # fmt: skip
    rows = []
    for affinity in (True, False):
        raw = {"model": model, "cluster": {"prefill_workers": 2, "detok_workers": 2},
               "router": {"prefix_affinity": affinity}}  # fmt: skip
        stack, url = start_stack(raw, work, f"affinity-{affinity}")
        try:
            for p in turns(rng, systems, len(systems), 3, 500):
                one_request(url, p, 2)
            row = load(url, turns(rng, systems, args.placement_requests, 3, 500), 16, 16)
            m = httpx.get(f"{url}/metrics", timeout=30).text
            row["hit_rate"] = hit_rate(m)
            rows.append({"placement": "prefix-aware" if affinity else "load only", **row})
            log.warning("affinity %s: %s", affinity, row)
        finally:
            stack.stop(timeout_s=60)
    return rows


def hit_rate(metrics: str) -> float:
    values = {}
    for line in metrics.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name):
                values[name] = float(line.rsplit(" ", 1)[1])
    queries = values.get("vllm:prefix_cache_queries_total", 0.0)
    return values.get("vllm:prefix_cache_hits_total", 0.0) / queries if queries else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=["all", "cache", "placement"], default="all")
    p.add_argument("--model", default="default")
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--requests-c1", type=int, default=8)
    p.add_argument("--requests-c16", type=int, default=48)
    p.add_argument("--placement-requests", type=int, default=160)
    p.add_argument("--fake-prefill-s", type=float, default=1.0, help="a whole prompt's prefill")
    p.add_argument("--out-json", default="")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    work = tempfile.mkdtemp(prefix="ss-prefix-bench-")
    out: dict[str, Any] = {}
    if args.part in ("all", "placement"):
        out["placement"] = placement_part(args, work)
    if args.part in ("all", "cache"):
        out["cache"] = cache_part(args, work)
    if args.out_json:
        with open(args.out_json, "w") as fh:
            json.dump(out, fh, indent=2)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
