"""The engine's own ceiling, no serving: the decode step in a tight loop at a slot count and
context length (every slot live), and bare prefill at the prompt length. Served throughput is
measured against its tokens/s; time to first token at concurrency 1 against its prefill time.

- measure.py: the measurement, through the Engine interface.
- probe.py: the engine built as a worker builds it, measured as often as asked, with settings.
- command.py: `splitserve bench --ceiling [--probe]` (the lab's suite keeps a probe up in a child
  process and measures it between its loads: lab/suite/ceiling_process.py).
"""
