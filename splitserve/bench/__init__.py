"""Benchmark tooling: a streaming load generator for any OpenAI-compatible endpoint, and the
engine's own ceiling (the decode step in a tight loop) that served throughput is measured against.

One idea per module:
- prompts.py: prompts of about N tokens (a word list; exact with a tokenizer), optional UTF-8.
- client.py: one streaming /v1/completions request over a raw asyncio HTTP/1.1 connection,
  timed per chunk (a lean client, so the load generator is not the bottleneck on few cores).
- load.py: fixed concurrency or Poisson arrivals at a fixed rate.
- stats.py: the per-run summary (throughput, TTFT, ITL, TPOT, end-to-end).
- scrape.py: the server's /metrics before and after a run: decode step gap and step time.
- ceiling/: `--ceiling`, the engine alone at a slot count and context length (the one home
  of the ceiling: its measurement, and the probe a benchmark suite keeps up between its loads).
- report.py, plots.py: JSON, a Markdown table, PNG plots.
- runner.py: one benchmark (several loads) end to end; what `__main__` calls, and the lab's
  suite and runners (lab/, outside the package).
"""
