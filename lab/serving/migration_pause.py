"""The pause a client sees when a worker dies: for each role, `splitserve serve` (which restarts the
dead worker) under N concurrent streams, one worker SIGKILLed (or SIGSTOPped past the liveness
timeout, then SIGCONTed) mid-stream; per stream, the longest gap between two chunks. Prints one
JSON object: per failure, p50 / p99 / max of those longest gaps, and whether every stream still
ended with all its tokens.

    .venv/bin/python lab/serving/migration_pause.py --engine fake --streams 32 --max-tokens 400
    .venv/bin/python lab/serving/migration_pause.py --engine jax --model random:tiny-7m \
        --tokenizer DIR --streams 32
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from splitserve.launch.ports import free_port  # noqa: E402
from splitserve.stats import quantiles  # noqa: E402
from splitserve.tokenizers.synthetic import build_synthetic_tokenizer  # noqa: E402


def stream(url: str, i: int, max_tokens: int, started: threading.Event) -> dict:
    """One streamed completion: its chunk times, token count and finish reason."""
    body = {
        "prompt": f"stream {i}", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    times, tokens, finish = [], 0, None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    times.append(time.monotonic())
                    started.set()
                finish = choice.get("finish_reason") or finish
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {"longest_gap_s": max(gaps, default=0.0), "tokens": tokens, "finish": finish}


def pid_of(url: str, role: str) -> int:
    for w in httpx.get(f"{url}/health", timeout=10).json()["workers"]:
        if (w["role"], w["index"]) == (role, 0):
            return w["pid"]
    raise LookupError(role)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "serve exited"
        try:
            health = httpx.get(f"{url}/health", timeout=2)
            if health.status_code == 200 and all(
                w["state"] == "ready" for w in health.json()["workers"]
            ):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("stack not ready")


def wait_back(url: str, role: str, old_pid: int, since: float, out: dict) -> None:
    """Poll /health until (role, 0) is ready again under another pid; out["s"]: how long."""
    deadline = since + 900
    while time.monotonic() < deadline:
        try:
            for w in httpx.get(f"{url}/health", timeout=2).json()["workers"]:
                if (w["role"], w["index"]) == (role, 0) and w["state"] == "ready" \
                        and w["pid"] != old_pid:
                    out["s"] = time.monotonic() - since
                    return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.1)


def one_failure(args, url: str, proc, role: str, how: str) -> dict:
    wait_ready(url, proc, 900)
    started = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
        futures = [pool.submit(stream, url, i, args.max_tokens, started)
                   for i in range(args.streams)]  # fmt: skip
        started.wait(120)
        time.sleep(args.kill_after_s)  # a benchmark, not a test: mid-stream on purpose
        pid = pid_of(url, role)
        back: dict = {}
        if how == "kill":
            watcher = threading.Thread(
                target=wait_back, args=(url, role, pid, time.monotonic(), back)
            )
            os.kill(pid, signal.SIGKILL)
            watcher.start()
        else:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(args.stop_s)
            os.kill(pid, signal.SIGCONT)
        results = [f.result() for f in futures]
    if how == "kill":
        watcher.join(900)
    gaps = [r["longest_gap_s"] for r in results]
    p50, p99 = quantiles(gaps, (0.5, 0.99))
    return {
        "failure": f"{how} {role}",
        "longest_gap_p50_s": round(p50, 3),
        "longest_gap_p99_s": round(p99, 3),
        "longest_gap_max_s": round(max(gaps), 3),
        # SIGKILL to the restarted worker's Ready (serve's back-off included)
        **({"worker_back_s": round(back["s"], 1)} if "s" in back else {}),
        "all_complete": all(r["finish"] == "length" and r["tokens"] == args.max_tokens
                            for r in results),  # fmt: skip
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="fake", choices=["fake", "jax"])
    p.add_argument("--model", default="default")
    p.add_argument("--tokenizer", default="")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--fake-step-s", type=float, default=0.01)
    p.add_argument("--kill-after-s", type=float, default=1.0)
    p.add_argument("--stop-s", type=float, default=3.0, help="SIGSTOP length (> liveness)")
    p.add_argument("--roles", default="detok,decode,prefill")
    args = p.parse_args()
    tokenizer = args.tokenizer
    if args.engine == "fake" and not tokenizer:
        tokenizer = build_synthetic_tokenizer(tempfile.mkdtemp(prefix="ss-tok-"), 512)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = os.path.join(tempfile.mkdtemp(prefix="ss-pause-"), "cluster.toml")
    with open(config, "w") as fh:
        fh.write(f"[model]\nengine = '{args.engine}'\npath = '{args.model}'\n"
                 f"tokenizer = '{tokenizer}'\nnum_slots = {args.streams}\n"
                 f"fake_step_s = {args.fake_step_s}\n[router]\nport = {port}\n"
                 f"max_running = {args.streams}\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "splitserve", "serve", "--config", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    out = []
    try:
        for role in args.roles.split(","):
            for how in ("kill", "stop"):
                out.append(one_failure(args, url, proc, role, how))
                print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
