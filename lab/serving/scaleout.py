"""Scale-out benchmark (xPyD): served tokens/s of P prefill x D decode workers at saturation, with
the fake engine given a fixed simulated step time (fake_step_s: it sleeps, as a wait on an
accelerator would, so a decode worker costs almost no CPU). D decode workers should serve about D
times the tokens/s of one. A second table compares the router's placement policies (load against
round-robin) on decode workers of unequal size.

    .venv/bin/python -m lab.serving.scaleout            # prints JSON and a markdown table

Each topology is its own stack (the launcher's ProcessStack, the same processes `splitserve
serve` starts), loaded by `splitserve bench`'s client at twice its total slots in flight.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from splitserve.bench.runner import BenchSettings, run_benchmark
from splitserve.config import config_from_dict
from splitserve.launch.health import every_worker_ready, health_url, wait_ready
from splitserve.launch.ports import free_port
from splitserve.launch.processes import ProcessStack
from splitserve.launch.roles import write_config
from splitserve.tokenizers.synthetic import build_synthetic_tokenizer

log = logging.getLogger(__name__)

TOPOLOGIES = ((1, 1), (1, 2), (2, 2), (2, 4))


@dataclass(frozen=True)
class Setup:
    prefill: int
    decode: int
    decode_slots: tuple[int, ...]
    placement: str = "load"

    @property
    def name(self) -> str:
        slots = "+".join(str(s) for s in self.decode_slots)
        return f"{self.prefill}P{self.decode}D ({slots} slots, {self.placement})"


def run_setup(setup: Setup, args: argparse.Namespace, tokenizer: str, work: str) -> dict:
    port = free_port()
    raw: dict[str, Any] = {
        "model": {"engine": "fake", "tokenizer": tokenizer, "max_seq_len": 512,
                  "fake_step_s": args.step_s, "fake_prefill_s": args.prefill_s},
        "cluster": {"prefill_workers": setup.prefill, "decode_workers": setup.decode,
                    "decode_slots": list(setup.decode_slots), "detok_workers": 2,
                    "run_dir": tempfile.mkdtemp(prefix="ss-scale-")},
        "router": {"port": port, "max_running": 2 * sum(setup.decode_slots),
                   "max_queued": 1024, "queue_timeout_s": 600.0,
                   "placement": setup.placement},
    }  # fmt: skip
    config = config_from_dict(raw)
    logs = os.path.join(work, setup.name.replace(" ", "_"))
    stack = ProcessStack(config, log_dir=logs, config_path=write_config(config))
    try:
        stack.start()
        wait_ready(health_url(config), 120, stack=stack, ready=every_worker_ready)
        in_flight = 2 * sum(setup.decode_slots)
        settings = BenchSettings(
            url=f"http://127.0.0.1:{port}", concurrencies=(in_flight,),
            num_requests=(args.requests_per_slot * sum(setup.decode_slots),),
            prompt_tokens=32, output_tokens=args.output_tokens, output_spread=0.25,
            tokenizer=tokenizer, progress=False,
        )  # fmt: skip
        run = run_benchmark(settings)["runs"][0]
        return {"setup": setup.name, "prefill": setup.prefill, "decode": setup.decode,
                "tokens_per_s": run["steady_output_tokens_per_s"],
                "failed": run["requests_failed"]}  # fmt: skip
    finally:
        stack.stop(timeout_s=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--step-s", type=float, default=0.05, help="simulated decode step")
    p.add_argument("--prefill-s", type=float, default=0.005, help="simulated prefill")
    p.add_argument("--slots", type=int, default=16, help="slots per decode worker")
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--requests-per-slot", type=int, default=4)
    p.add_argument("--out-json", default="")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    work = tempfile.mkdtemp(prefix="ss-scaleout-")
    tokenizer = build_synthetic_tokenizer(os.path.join(work, "tok"), 512)
    scaling = [run_setup(Setup(pf, d, (args.slots,) * d), args, tokenizer, work)
               for pf, d in TOPOLOGIES]  # fmt: skip
    base = scaling[0]["tokens_per_s"]
    for row in scaling:
        row["vs_1p1d"] = round(row["tokens_per_s"] / base, 2)
        row["target"] = round(0.9 * row["decode"], 2)
    uneven = (args.slots, args.slots // 2)
    policies = [run_setup(Setup(1, 2, uneven, placement), args, tokenizer, work)
                for placement in ("load", "round_robin")]  # fmt: skip
    out = {"step_s": args.step_s, "scaling": scaling, "policies": policies}
    if args.out_json:
        with open(args.out_json, "w") as fh:
            json.dump(out, fh, indent=2)
    print(json.dumps(out, indent=2))
    print("\n| setup | out tok/s | x 1P1D | target (0.9 x D) |\n|---|---|---|---|")
    for row in scaling:
        print(f"| {row['setup']} | {row['tokens_per_s']:,.0f} | {row['vs_1p1d']:.2f} | "
              f"{row['target']:.2f} |")  # fmt: skip
    print("\n| placement (1P2D, uneven slots) | out tok/s |\n|---|---|")
    for row in policies:
        print(f"| {row['setup']} | {row['tokens_per_s']:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
