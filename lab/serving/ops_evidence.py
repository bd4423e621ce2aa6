"""What operators' tools read from a running server: a fake-engine stack, a real
Prometheus scraping its /metrics, inference-perf (its `vllm` server type, which reads vLLM's
metric names through that Prometheus) driving it briefly, then one Prometheus query. Writes the
inference-perf server-metrics report and the query's answer to OUT (lab/results, one dated file
each).

    .venv/bin/python lab/serving/ops_evidence.py --inference-perf ~/ip-venv/bin/inference-perf

inference-perf needs Python 3.12 and is no dependency of splitserve: install it in a venv of its
own (`python3.12 -m venv ~/ip-venv && ~/ip-venv/bin/pip install
inference-perf`).
Prometheus: Debian's `prometheus` package.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from splitserve.launch.ports import free_port  # noqa: E402
from splitserve.tokenizers.synthetic import build_synthetic_tokenizer  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"  # the served name of the default model (the fake engine's too)
SERVE = os.path.join(os.path.dirname(sys.executable), "splitserve")
QUERY = 'sum by (__name__) ({__name__=~"vllm:.*_total", model_name="' + MODEL + '"})'


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def inference_perf_config(
    server_url: str, prom_url: str, out_dir: str, seconds: int, tokenizer: str
) -> dict:
    return {
        "tokenizer": {"pretrained_model_name_or_path": tokenizer},  # the stack's own, no hub
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "mock"},
        "load": {"type": "constant", "stages": [{"rate": 8, "duration": seconds}]},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": server_url,
                   "ignore_eos": True},  # fmt: skip
        "metrics": {"type": "prometheus", "prometheus": {"url": prom_url, "scrape_interval": 1}},
        "report": {"request_lifecycle": {"summary": True, "per_stage": False},
                   "prometheus": {"summary": True, "per_stage": False}},  # fmt: skip
        "storage": {"local_storage": {"path": out_dir}},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inference-perf", required=True, help="the inference-perf executable")
    p.add_argument("--prometheus", default=shutil.which("prometheus") or "prometheus")
    p.add_argument("--seconds", type=int, default=20, help="how long inference-perf drives load")
    p.add_argument("--out", default="lab/results")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="ops-evidence-")
    tok = build_synthetic_tokenizer(os.path.join(work, "tok"), 512)
    port, prom_port = free_port(), free_port()
    server, prom_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{prom_port}"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [SERVE, "serve", "--engine", "fake", "--tokenizer", tok, "--port", str(port)],
            stdout=open(os.path.join(work, "serve.log"), "w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        ))  # fmt: skip
        wait_for(lambda: answers(f"{server}/health"), 180, "the stack to be ready")
        with open(os.path.join(work, "prometheus.yml"), "w") as fh:
            yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
                {"job_name": "splitserve", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
            ]}, fh)  # fmt: skip
        procs.append(subprocess.Popen(
            [args.prometheus, f"--config.file={work}/prometheus.yml",
             f"--storage.tsdb.path={work}/tsdb", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"),
        ))  # fmt: skip
        wait_for(lambda: answers(f"{prom_url}/-/ready"), 60, "Prometheus")
        reports = os.path.join(work, "reports")
        with open(os.path.join(work, "ip.yml"), "w") as fh:
            tok_dir = os.path.dirname(tok)
            ip = inference_perf_config(server, prom_url, reports, args.seconds, tok_dir)
            yaml.safe_dump(ip, fh)
        run = subprocess.run([args.inference_perf, "-c", f"{work}/ip.yml"], capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        with open(os.path.join(work, "inference-perf.log"), "w") as fh:
            fh.write(run.stdout + run.stderr)
        found = sorted(glob.glob(f"{reports}/**/*prometheus*.json", recursive=True))
        if run.returncode != 0 or not found:
            raise SystemExit(f"inference-perf exit {run.returncode}, reports {found}: "
                             f"{(run.stdout + run.stderr)[-3000:]}")  # fmt: skip
        dated = os.path.join(args.out, time.strftime("%Y-%m-%d-"))  # one result file a run
        shutil.copy(found[0], f"{dated}inference-perf-server-metrics.json")
        answer = httpx.get(f"{prom_url}/api/v1/query", params={"query": QUERY}, timeout=10).json()
        with open(f"{dated}prometheus-query.txt", "w") as fh:
            fh.write(f"GET {prom_url}/api/v1/query?query={QUERY}\n\n")
            fh.write(json.dumps(answer, indent=1) + "\n")
        print(f"wrote {dated}inference-perf-server-metrics.json and {dated}prometheus-query.txt "
              f"(work files in {work})")  # fmt: skip
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
