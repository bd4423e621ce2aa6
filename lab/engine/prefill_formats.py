"""The prefill side's weight formats against each other in one process: the time of a burst of
prompts (the engine alone, batched as the prefill worker batches them) and the greedy answers
each gives the same chat questions (the decode side the same for all: the model's own form).

    .venv/bin/python lab/engine/prefill_formats.py --threads 1 float32 bfloat16-xla

Rounds alternate the formats, so that a busy host slows them alike; the burst's time is the
median over rounds. The answers are compared with the first format's, token for token.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

QUESTIONS = (
    "What is the capital of France?", "Write a haiku about the sea.", "Name three colours.",
    "Explain photosynthesis in one sentence.", "What is 12 times 7?", "Who wrote Hamlet?",
    "Give me a recipe for pancakes.", "Translate 'good morning' into Spanish.",
    "What is the largest planet?", "Tell me a joke about computers.",
    "List the days of the week.", "What does a CPU do?", "Describe a cat in two sentences.",
    "Why is the sky blue?", "How many legs does a spider have?",
    "What is the boiling point of water?", "Write a limerick about a frog.",
    "What is machine learning?", "Summarise the plot of Cinderella.",
    "What is the speed of light?",
)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("formats", nargs="+",
                    help="prefill weight formats (float32, bfloat16-xla, bfloat16-native)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=1, help="XLA intra-op threads")
    ap.add_argument("--burst", type=int, default=16, help="prompts in the burst")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--batch-tokens", type=int, default=256, help="prompt tokens a call")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--answer-tokens", type=int, default=48, help="greedy tokens per answer")
    args = ap.parse_args(argv)

    from splitserve.engine.compile.jax_setup import configure_jax_runtime

    configure_jax_runtime(cpu_threads=args.threads)
    import numpy as np

    from splitserve.engine import resolve_model_path
    from splitserve.engine.compile.buckets import length_buckets
    from splitserve.engine.interface import SamplingParams
    from splitserve.engine.jax.build import build_jax_engine
    from splitserve.tokenizers import load_tokenizer

    path = resolve_model_path(args.model)
    tok = load_tokenizer(path)
    chats = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
             for q in QUESTIONS]  # fmt: skip
    rng = np.random.default_rng(0)
    burst = [[int(t) for t in rng.integers(100, 20000, args.prompt_tokens)]
             for _ in range(args.burst)]  # fmt: skip
    greedy = SamplingParams()
    engines = {}
    for fmt in args.formats:
        t = time.perf_counter()
        engines[fmt] = build_jax_engine(
            path, 1, 512, prefill_weight_format=fmt, prefill_batch_tokens=args.batch_tokens,
            prefill_counts=length_buckets(1, max(1, args.batch_tokens // 16)),
        )  # fmt: skip
        engines[fmt].prefill_batch(burst, [greedy] * len(burst))  # compiles its shapes
        print(f"built {fmt} in {time.perf_counter() - t:.1f} s", flush=True)
    times: dict[str, list[float]] = {fmt: [] for fmt in args.formats}
    for _ in range(args.rounds):
        for fmt, engine in engines.items():
            t = time.perf_counter()
            engine.prefill_batch(burst, [greedy] * len(burst))
            times[fmt].append(time.perf_counter() - t)
    answers = {}
    for fmt, engine in engines.items():
        answers[fmt] = []
        for ids in chats:
            prefix = engine.prefill(ids, greedy)
            engine.insert(prefix, 0, greedy)
            out = [prefix.first_token]
            out += [int(engine.generate().tokens[0]) for _ in range(args.answer_tokens)]
            engine.free(0)
            answers[fmt].append(out)
    base = args.formats[0]
    print(f"\nmodel {os.path.basename(path)}, {args.threads} XLA thread(s), burst of "
          f"{args.burst} x {args.prompt_tokens} tokens ({args.batch_tokens} a call), "
          f"{args.rounds} rounds; "
          f"answers: {len(QUESTIONS)} chat questions, {args.answer_tokens + 1} greedy tokens\n")
    print("| prefill format | burst s (median) | ratio | answers equal to " + base + " |")
    print("|---|---|---|---|")
    b0 = statistics.median(times[base])
    for fmt in args.formats:
        med = statistics.median(times[fmt])
        same = sum(a == b for a, b in zip(answers[fmt], answers[base], strict=True))
        print(f"| {fmt} | {med:.2f} | {med / b0:.2f} | {same} of {len(QUESTIONS)} |")
    for fmt in args.formats[1:]:
        for q, a, b in zip(QUESTIONS, answers[base], answers[fmt], strict=True):
            if a != b:
                k = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
                print(f"- {fmt}, {q!r}: from token {k}: {tok.decode(a[:k + 6])!r} "
                      f"against {tok.decode(b[:k + 6])!r}")


if __name__ == "__main__":
    main()
