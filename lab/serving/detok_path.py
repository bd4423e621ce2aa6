"""Measure the cost of the detok path in a short run: TokenBatch messages per decode step and
microseconds of detok-worker work per token. Prints one JSON object.

    .venv/bin/python lab/serving/detok_path.py --mode processes --requests 256 --max-tokens 256

Uses the fake engine (no model compute), real worker processes (or threads) and real sockets,
with a synthetic 8,000-id tokenizer; the figures come from the workers' own heartbeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from router.requests import RequestParams  # noqa: E402
from splitserve.launch.pipeline import fake_engine_config, pipeline  # noqa: E402
from splitserve.tokenizers import load_tokenizer  # noqa: E402
from splitserve.tokenizers.synthetic import build_synthetic_tokenizer  # noqa: E402


async def measure(args) -> dict:
    tok_path = build_synthetic_tokenizer(os.path.join(tempfile.gettempdir(), "ss-tok-8000"), 8000)
    tok = load_tokenizer(tok_path)
    config = fake_engine_config(
        tok_path,
        args.mode,
        model={"num_slots": args.slots, "max_seq_len": 4096},
        cluster={"detok_workers": args.detok_workers},
        router={"max_running": args.slots, "max_queued": args.requests},
    )
    async with pipeline(config) as (core, _):
        prompt = tok.encode("Ünïcödé 東京 🙂 and some plain words " * 4)
        params = RequestParams(max_tokens=args.max_tokens, ignore_eos=True, stop=("zzq", "東京🙂"))
        start = time.perf_counter()

        async def one():
            return await (await core.submit(prompt, params)).finished()

        results = await asyncio.gather(*(one() for _ in range(args.requests)))
        wall = time.perf_counter() - start
        await asyncio.sleep(3 * config.lifecycle.heartbeat_interval_s)  # final heartbeats
        decode = core.workers.get("decode", 0).load
        detoks = [w.load for w in core.workers.workers.values() if w.role == "detok"]
    tokens = sum(r.completion_tokens for _, r in results)
    detok_s = sum(d.pass_time.sum for d in detoks)
    detok_tokens = sum(d.tokens for d in detoks)
    return {
        "mode": args.mode,
        "requests": args.requests,
        "completion_tokens": tokens,
        "wall_s": round(wall, 3),
        "decode_steps": decode.steps,
        "token_batches_from_decode": decode.batches_sent,
        "messages_per_decode_step": round(decode.batches_sent / max(1, decode.steps), 3),
        "tokens_per_message": round(decode.tokens_sent / max(1, decode.batches_sent), 2),
        "detok_workers": args.detok_workers,
        "detok_us_per_token": round(1e6 * detok_s / max(1, detok_tokens), 2),
        "text_batches_to_router": sum(d.batches_out for d in detoks),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", default="processes", choices=["processes", "threads"])
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--detok-workers", type=int, default=2)
    args = p.parse_args()
    print(json.dumps(asyncio.run(measure(args)), indent=2))


if __name__ == "__main__":
    main()
