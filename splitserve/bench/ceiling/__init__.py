"""The engine's own ceiling, no serving: the decode step in a tight loop at a slot count and
context length (every slot live), and bare prefill at the prompt length. Served throughput is
measured against its tokens/s; time to first token at concurrency 1 against its prefill time.

- measure.py: the measurement, through the Engine interface.
- probe.py: the engine built as a worker builds it, measured as often as asked, with settings.
- process.py: the probe in a child process that stays up, measured between a suite's loads.
- command.py: `splitserve bench --ceiling [--probe]`.
"""
