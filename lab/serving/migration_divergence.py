"""How often a moved greedy stream continues differently, on a real checkpoint (default: the
default model, SmolLM2-135M-Instruct).

A stream whose decode worker dies is re-prefilled (prompt + its tokens so far as one pass) and
decodes on; prefill and decode may round differently, so its later tokens may differ from an
undisturbed run's. This runs STREAMS greedy streams undisturbed, then the same streams again,
freezes the decode worker once every stream has tokens, kills it, restarts it, and counts the
streams whose tokens differ after the move. Whatever the arithmetic does, every stream must end
with all its tokens, its text exactly the detokenization of the ids received, and its ids equal
to the undisturbed run's up to the move: the script fails (exit 1) if not.

    .venv/bin/python lab/serving/migration_divergence.py [--model default] [--streams 32] \
        [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

from router.requests import RequestParams
from splitserve import run_dirs
from splitserve.config import ModelConfig, config_from_dict
from splitserve.launch.pipeline import pipeline, wait_for
from splitserve.tokenizer_path import tokenizer_path
from splitserve.tokenizers import load_tokenizer

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List three facts about the Moon.",
    "What is the capital of France, and why is it famous?",
]


async def measure(args) -> int:
    model = {"engine": "jax", "path": args.model, "num_slots": args.streams, "max_seq_len": 512}
    model["tokenizer"] = tokenizer_path(ModelConfig(**model))  # the router core loads it
    config = config_from_dict({
        "model": model,
        "cluster": {"mode": "processes"},
        # the restarted worker compiles (or reads from the cache) before it takes them over
        "router": {"max_running": args.streams, "migration_timeout_s": 3600.0},
        "lifecycle": {"liveness_timeout_s": 10.0},
    }, run_dirs.create)  # fmt: skip
    tok = load_tokenizer(config.model.tokenizer)
    prompts = [tok.encode(f"{PROMPTS[i % len(PROMPTS)]} ({i})") for i in range(args.streams)]
    params = RequestParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    async with pipeline(config, ready_s=1800) as (core, stack):
        calm = [await core.submit(p, params) for p in prompts]
        await asyncio.gather(*(h.finished() for h in calm))
        undisturbed = [list(h.token_ids) for h in calm]
        handles = [await core.submit(p, params) for p in prompts]
        await wait_for(lambda: all(h.completion_tokens for h in handles), 600, "tokens")
        stack.children[("decode", 0)].popen.send_signal(signal.SIGSTOP)
        reached = [h.completion_tokens for h in handles]
        stack.kill("decode", 0)
        killed = time.monotonic()
        await wait_for(lambda: core.workers.get("decode", 0).state == "dead", 60, "noticed")
        stack.restart("decode", 0)
        await wait_for(lambda: core.workers.get("decode", 0).state == "ready", 3600, "back")
        back = time.monotonic() - killed
        results = await asyncio.wait_for(asyncio.gather(*(h.finished() for h in handles)), 1800)
        took = time.monotonic() - killed
    bad, differ, first_diff = [], 0, []
    for h, (text, result), calm_ids, n in zip(handles, results, undisturbed, reached, strict=True):
        ids = list(h.token_ids)
        if result.finish_reason.api != "length" or len(ids) != args.tokens:
            bad.append(f"{h.request_id}: {result}")
        elif text != tok.decode(ids, skip_special_tokens=True) or ids[:n] != calm_ids[:n]:
            bad.append(f"{h.request_id}: text or tokens before the move differ")
        elif ids != calm_ids:
            differ += 1
            pairs = enumerate(zip(ids, calm_ids, strict=True))
            first_diff.append(next(i for i, (a, b) in pairs if a != b) - n)
    moved = sum(h.migrations > 0 for h in handles)
    print(f"model {args.model}: {args.streams} greedy streams of {args.tokens} tokens, decode "
          f"worker killed after {min(reached)}..{max(reached)} tokens; {moved} moved; "
          f"{differ} continued differently"
          + (f" (first differing token {sorted(first_diff)} tokens after the move)" if differ
             else "")
          + f"; the decode worker was back {back:.0f} s and every stream ended {took:.0f} s after "
          "the kill")  # fmt: skip
    for line in bad:
        print("FAILED", line)
    return 1 if bad or not moved else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    return asyncio.run(measure(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
