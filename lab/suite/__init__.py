"""The standard benchmark suite, in one go: writes lab/suite.md and its plots (lab/results/suite/).
From the checkout's root (`make bench-suite` runs the first):

    .venv/bin/python -m lab.suite            # full: about 15 minutes on 2 CPU cores
    .venv/bin/python -m lab.suite --quick    # a few minutes, small sizes
    .venv/bin/python -m lab.suite --sections tiny,fake --doc b.md --assets b

Sections (each one stack per mode, started by
the launcher as `splitserve serve` starts it, and always stopped):
 1. tiny: random:tiny-7m (8,000-id synthetic tokenizer): the engine ceiling at the served slot
    count and mean context, then served throughput at concurrency 1, 16, 64, 128 in processes
    and in threads mode: same engine, same load, same run.
 2. detok: a detokenization-heavy load on tiny-7m: 128 concurrent streams (128 slots), long
    outputs, several stop strings each, prompts with multi-byte UTF-8; processes and threads.
 3. fake: the fake engine (no model compute): what the serving pipeline alone sustains.
 4. smollm2: SmolLM2-135M-Instruct (the default model, its GGUF tokenizer): ceiling and sweep.
The engine ceiling is measured in a child process that builds the engine once and measures it
again before the first load and after each one, while the stack is idle between loads. Each load
is judged against the mean of the two measurements on either side of it, seconds apart, so that
the engine's drift over minutes on a shared host stays out of the served/ceiling ratio.

CPU layout (on a host with 2 or more CPUs): the decode worker owns the first CPU; the prefill,
detok and router processes share the others with the load generator (this process), and so do
the workers' zmq I/O threads. The ceiling runs on one CPU, as the served decode and prefill
engines each do. Threads mode cannot place its roles: its one process may use every CPU (the
load generator still keeps to the others).

One idea per module:
- sections.py: the Section definitions, their quick versions, a load's bench settings.
- cpus.py: the CPU layout (the decode worker's CPU, everyone else's).
- stacks.py: a section's served stack in one mode (the launcher's ProcessStack), ready or not.
- brackets.py: the ceiling a load is judged against, from the measurements around it.
- running.py: a section end to end: the ceiling child, the stacks, the loads between ceilings.
- results.py: what a section's run leaves, and lookups in it.
- targets.py: the targets table (one row per target, a verdict each).
- document.py: lab/suite.md and the JSON records.
- ceiling_process.py: the engine ceiling (`splitserve bench --ceiling --probe`) in a child
  process that stays up, measured between the loads.
- __main__.py: the command line.
"""

from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])  # the checkout: lab/ and git live there
