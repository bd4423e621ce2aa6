"""Servers in turn under one load, rounds alternating them so a busy host slows them alike; the
table gives each server's median over rounds and its ratio to the first server named."""

from __future__ import annotations

import os
import statistics
import tempfile
from typing import Any

from lab.versus.servers import Server, ServerSpec
from splitserve.bench.runner import BenchSettings, run_benchmark

FIGURES = (("output_tokens_per_s", "tok/s"), ("ttft_p50", "TTFT p50 s"), ("ttft_p90", "TTFT p90 s"))


def measure(spec: ServerSpec, args: Any, port: int, log_dir: str, round_no: int) -> list[dict]:
    """One round of one server: started, every concurrency measured, stopped."""
    log = os.path.join(log_dir, f"{spec.label}-{round_no}.log")
    server = Server(spec, port, log, args.root)
    try:
        server.ready(args.ready_timeout)
        settings = BenchSettings(
            url=server.url, model="default", endpoint="completions",
            concurrencies=args.concurrency, rates=(), num_requests=args.num_requests,
            prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
            output_spread=0.0, stop=(), unicode_prompts=False, tokenizer=None,
            temperature=0.0, seed=0, warmup_requests=args.warmup_requests,
            request_timeout_s=600.0, api_key=None, progress=False, metrics=False,
        )  # fmt: skip
        runs = run_benchmark(settings, check=False)["runs"]
    finally:
        server.stop()
    return [
        {"server": spec.label, "round": round_no, "concurrency": r["concurrency"],
         "ok": r["requests_ok"], "failed": r["requests_failed"],
         "output_tokens_per_s": r["output_tokens_per_s"],
         "ttft_p50": (r.get("ttft_s") or {}).get("p50"),
         "ttft_p90": (r.get("ttft_s") or {}).get("p90")}
        for r in runs
    ]  # fmt: skip


def run_all(args: Any) -> list[dict]:
    specs = [ServerSpec.parse(s) for s in args.server]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="versus-")
    os.makedirs(log_dir, exist_ok=True)  # a --log-dir that does not exist yet is made
    rows: list[dict] = []
    for round_no in range(args.rounds):
        # alternate the order too: the first server of a round never always gets a cold host
        order = specs if round_no % 2 == 0 else list(reversed(specs))
        for spec in order:
            rows += measure(spec, args, args.port, log_dir, round_no)
            print(rows[-len(args.concurrency):], flush=True)
    return rows


def table(rows: list[dict], servers: list[str]) -> str:
    """Markdown: per concurrency and server, medians over rounds and ratios to the first."""
    out = ["| concurrency | server | rounds | tok/s | vs first | TTFT p50 s | TTFT p90 s |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in sorted({r["concurrency"] for r in rows}):
        med = {}
        for label in servers:
            mine = [r for r in rows if r["server"] == label and r["concurrency"] == c]
            med[label] = {k: statistics.median(r[k] for r in mine if r[k] is not None)
                          for k, _ in FIGURES if any(r[k] is not None for r in mine)}  # fmt: skip
            med[label]["n"] = len(mine)
            med[label]["failed"] = sum(r["failed"] for r in mine)
        base = med[servers[0]].get("output_tokens_per_s")
        for label in servers:
            m = med[label]
            tps = m.get("output_tokens_per_s")
            ratio = f"{tps / base:.2f}x" if tps and base else "–"
            failed = f" ({m['failed']} failed)" if m["failed"] else ""
            out.append(f"| {c} | {label}{failed} | {m['n']} | {tps:.1f} | {ratio} | "
                       f"{m.get('ttft_p50', float('nan')):.2f} | "
                       f"{m.get('ttft_p90', float('nan')):.2f} |")  # fmt: skip
    return "\n".join(out) + "\n"
