"""How long `splitserve serve` takes to its ready line: cold (an empty JAX compilation cache) and
warm (the cache the cold runs filled), each run several times; for every run also the longest
gap between two lines of its output (a cold start must show a line at least every 10 s).
Prints one JSON object: each run's seconds and longest gap, and the medians (a shared machine is
noisy: quote the medians).

    .venv/bin/python lab/serving/start_times.py --runs 2            # the default model
    .venv/bin/python lab/serving/start_times.py --runs 1 --warm-runs 2
    .venv/bin/python lab/serving/start_times.py --runs 2 -- --engine fake --tokenizer DIR

Each cold run gets a fresh --compilation-cache-dir, and a warm run follows it on that cache.
Everything after `--` goes to `splitserve serve` as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from splitserve.launch.ports import free_port  # noqa: E402

READY = "splitserve: ready on "
SERVE = os.path.join(os.path.dirname(sys.executable), "splitserve")


def one_start(cache_dir: str, extra: list[str], timeout_s: float, log_path: str) -> dict:
    """Start a stack, read its output to the ready line, stop it: the seconds to ready and the
    longest silence between two output lines before it."""
    cmd = [SERVE, "serve", "--port", str(free_port()), "--compilation-cache-dir", cache_dir,
           "--ready-timeout", str(timeout_s), *extra]  # fmt: skip
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)  # fmt: skip
    last, longest, gap_before = began, 0.0, ""
    ready_s = None
    try:
        with open(log_path, "w") as log:
            assert proc.stdout is not None
            for line in proc.stdout:  # a line at a time, as it comes
                now = time.monotonic()
                log.write(f"{now - began:8.2f} {line}")
                if now - last > longest:
                    longest, gap_before = now - last, line.strip()[:160]
                last = now
                if line.startswith(READY):
                    ready_s = now - began
                    break
                if now - began > timeout_s:
                    break
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the clean stop
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if ready_s is None:
        raise SystemExit(f"no ready line within {timeout_s} s (exit {proc.returncode}): {log_path}")
    return {"ready_s": round(ready_s, 1), "longest_gap_s": round(longest, 1),
            "line_after_longest_gap": gap_before, "log": os.path.basename(log_path)}  # fmt: skip


def summary(runs: list[dict]) -> dict:
    return {
        "runs": runs,
        "median_ready_s": round(statistics.median(r["ready_s"] for r in runs), 1),
        "longest_gap_s": max(r["longest_gap_s"] for r in runs),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="cold runs, each followed by a warm one")
    p.add_argument("--warm-runs", type=int, default=1, help="warm runs after each cold one")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds to wait for ready (serve's own --ready-timeout follows it)")
    p.add_argument("--out", default=None, help="directory for each run's output (a temp dir)")
    args = p.parse_args(own)
    out = args.out or tempfile.mkdtemp(prefix="start-times-")
    os.makedirs(out, exist_ok=True)
    print(f"each run's output in {out}", file=sys.stderr, flush=True)
    cold, warm = [], []
    try:
        # each cold start, then a warm one from its cache: a run cut short still has both
        for i in range(args.runs):
            cache = tempfile.mkdtemp(prefix="jax-cache-")
            try:
                cold.append(one_start(cache, extra, args.timeout, f"{out}/cold-{i}.log"))
                print(f"cold {i}: {json.dumps(cold[-1])}", file=sys.stderr, flush=True)
                for j in range(args.warm_runs):
                    log = f"{out}/warm-{i}-{j}.log"
                    warm.append(one_start(cache, extra, args.timeout, log))
                    print(f"warm {i}.{j}: {json.dumps(warm[-1])}", file=sys.stderr, flush=True)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        if cold:
            # a result file: no path of this host (the logs are named, their folder said above)
            print(json.dumps({"command": ["splitserve", "serve", *extra], "cold": summary(cold),
                              "warm": summary(warm) if warm else None}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
