"""`splitserve bench` / `python -m splitserve.bench`: load an OpenAI-compatible endpoint, or
(`--ceiling`) measure the engine alone.

    splitserve bench --url http://127.0.0.1:8000 --concurrency 1,16,64 --num-requests 64 \\
        --prompt-tokens 128 --output-tokens 64 --out-json b.json --out-md b.md --plot-dir plots
    splitserve bench --url http://127.0.0.1:8000 --rate 4 --concurrency 64 --num-requests 200
    splitserve bench --url http://127.0.0.1:8000 --endpoint chat --concurrency 16
    splitserve bench --ceiling --model random:tiny-7m --slots 16 --context 160
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from splitserve.bench import plots, report
from splitserve.bench.ceiling.command import add_ceiling_args, ceiling_main
from splitserve.bench.runner import BenchSettings, compare_to_ceiling, run_benchmark


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="splitserve bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--model", help="model name to send; with --ceiling: the model to load "
                   "(.gguf, Hugging Face folder, random:<preset>, default)")  # fmt: skip
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="/v1/completions (the prompt as text) or /v1/chat/completions (the "
                   "prompt as a user message, through the chat template)")  # fmt: skip
    p.add_argument("--concurrency", type=_ints, default=None,
                   help="requests in flight, e.g. 1,16,64 (one run each); with --rate: a cap")
    p.add_argument("--rate", type=_floats, default=(), help="requests/s, Poisson arrivals, "
                   "e.g. 2,4,8 (one run each)")  # fmt: skip
    p.add_argument("--num-requests", type=_ints, default=(64,),
                   help="requests per run: one value, or one per run")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64, help="max_tokens (with ignore_eos)")
    p.add_argument("--output-spread", type=float, default=0.0,
                   help="draw each request's max_tokens uniformly within +/- this fraction of "
                        "--output-tokens (e.g. 0.5), so requests end at different times")
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument("--unicode-prompts", action="store_true", help="multi-byte UTF-8 in prompts")
    p.add_argument("--tokenizer", help="size prompts exactly with this tokenizer")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-requests", type=int, default=2)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--api-key", default=os.environ.get("SPLITSERVE_API_KEY"))
    p.add_argument("--no-metrics", action="store_true", help="do not read /metrics")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--ceiling-json", help="a --ceiling JSON to compare served throughput with")
    p.add_argument("--out-json")
    p.add_argument("--json-samples", action="store_true", help="raw latencies in the JSON too")
    p.add_argument("--out-md")
    p.add_argument("--plot-dir")
    p.add_argument("--title", default="splitserve benchmark")
    add_ceiling_args(p)
    return p


def load_main(args: argparse.Namespace) -> int:
    settings = BenchSettings(
        url=args.url,
        model=args.model,
        endpoint=args.endpoint,
        concurrencies=args.concurrency or ((1,) if not args.rate else ()),
        rates=args.rate,
        num_requests=args.num_requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        output_spread=args.output_spread,
        stop=tuple(args.stop),
        unicode_prompts=args.unicode_prompts,
        tokenizer=args.tokenizer,
        temperature=args.temperature,
        seed=args.seed,
        warmup_requests=args.warmup_requests,
        request_timeout_s=args.request_timeout,
        api_key=args.api_key,
        progress=not args.no_progress,
        metrics=not args.no_metrics,
    )
    try:
        result = run_benchmark(settings)
    except (ConnectionError, ValueError) as exc:
        print(f"splitserve bench: {exc}", file=sys.stderr)
        return 2
    if args.ceiling_json:
        with open(args.ceiling_json, encoding="utf-8") as fh:
            compare_to_ceiling(result, json.load(fh))
    text = report.markdown(result, args.title)
    if args.plot_dir:
        made = [
            plots.plot_latency(result["runs"], os.path.join(args.plot_dir, "latency_cdf.png"),
                               args.title),
            plots.plot_throughput(
                {"served": result["runs"]},
                os.path.join(args.plot_dir, "throughput_vs_load.png"),
                x_key="rate" if settings.rates else "concurrency",
                ceilings={"engine ceiling": (result.get("ceiling") or {}).get("tokens_per_s")},
                title=args.title,
            ) if len(result["runs"]) > 1 else None,
        ]  # fmt: skip
        made = [m for m in made if m]
        md_dir = os.path.dirname(os.path.abspath(args.out_md)) if args.out_md else os.getcwd()
        text += "\n" + "".join(
            f"![{os.path.basename(m)}]({os.path.relpath(m, md_dir)})\n" for m in made
        )
    print(report.load_table(result["runs"]))
    if args.out_json:
        report.write_json(result, args.out_json, samples=args.json_samples)
    if args.out_md:
        report.write_markdown(text, args.out_md)
    failed = sum(r["requests_failed"] for r in result["runs"])
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.ceiling:
        return ceiling_main(args)
    return load_main(args)


if __name__ == "__main__":
    sys.exit(main())
