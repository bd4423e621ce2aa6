"""KV transfer between two hosts: a prefix of the default model's KV layout (SmolLM2-135M: K and V
of 30 layers x 3 KV heads x 64 dims, float32: 46,080 bytes a token), sent from a "prefill" process
in one network namespace to a "decode" process in another (lab/hosts/netns.py: veth links
through a bridge, real TCP stacks), with and without CURVE, through the workers' own transport
(lab/hosts/kv_peer.py). Prints a table of bytes, median and p90 time, throughput, the
time the sending loop spends (median), and copies per prompt length, and the raw figures as JSON
with --json. Needs root (namespaces).

    .venv/bin/python -m lab.hosts.kv_transfer --repeats 15

Copies: "splitserve" is what this code checks on every transfer (the frames sent are the
arrays' own memory; the arrays rebuilt are the received frames' memory). What libzmq does
beneath is fixed by libzmq: without CURVE a large frame is written to the socket from its own
buffer and read from it into one buffer; with CURVE each message is encrypted into, and
decrypted out of, buffers of its own (libzmq's curve_mechanism_base.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from lab.hosts.kv_peer import layout
from lab.hosts.netns import Hosts
from splitserve.engine.model.default_model import default_model_path
from splitserve.engine.model.weights_gguf import config_from_gguf, read_gguf
from splitserve.security import generate_keys

SUBNET = "10.213.31"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORT, ACK_PORT = 5552, 5553


def default_layout() -> str:
    """layers,kv_heads,head_dim,dtype of the default model, read from its GGUF header (the
    JAX engine's KV cache is float32)."""
    meta, tensors = read_gguf(default_model_path())
    cfg = config_from_gguf(meta, set(tensors), tensors["token_embd.weight"][1][-1])
    return f"{cfg.layers},{cfg.kv_heads},{cfg.head_dim},float32"


def measure(spec: str, lengths: list[int], repeats: int, curve: bool) -> list[dict]:
    """One run of kv_peer's two ends, each in its namespace; the sender's JSON lines."""
    with tempfile.TemporaryDirectory() as keys, Hosts(["prefill", "decode"], SUBNET) as hosts:
        peer = [sys.executable, "-m", "lab.hosts.kv_peer"]  # from the checkout (cwd=REPO)
        common = ["--acks", f"tcp://{hosts.address['prefill']}:{ACK_PORT}", "--layout", spec]
        if curve:
            generate_keys(keys, ["prefill-0", "decode-0"])
            common += ["--keys", keys]
        to = f"tcp://{hosts.address['decode']}:{PORT}"
        receiver = hosts.popen("decode", [*peer, "receive", "--bind", to, *common], cwd=REPO)
        try:
            time.sleep(1.0)  # bound before the sender's first connect (it would retry anyway)
            cmd = [*peer, "send", "--to", to, *common, "--repeats", str(repeats), "--lengths",
                   *map(str, lengths)]  # fmt: skip
            out = subprocess.run(hosts.command("prefill", cmd), capture_output=True, text=True,
                                 timeout=1800, cwd=REPO)  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(f"sender failed: {out.stderr[-2000:]}")
            return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        finally:
            receiver.kill()
            receiver.wait()


def memcpy_s(nbytes: int, repeats: int = 5) -> float:
    """The median time of one memcpy of nbytes here: what one copy of a prefix would cost."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # the pages of dst mapped first: a prefix arrives into mapped memory too
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def table(rows: list[dict]) -> str:
    lines = [
        "| prompt tokens | bytes | CURVE | median ms | p90 ms | GB/s | prefill loop ms "
        "| splitserve copies (send / receive) | one memcpy, ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        copies = f"{0 if r['send_views'] else 1} / {0 if r['receive_views'] else 1}"
        lines.append(
            f"| {r['tokens']:,} | {r['bytes']:,} | {'yes' if r['curve'] else 'no'} | "
            f"{r['median_s'] * 1e3:.1f} | {r['p90_s'] * 1e3:.1f} | "
            f"{r['bytes'] / r['median_s'] / 1e9:.2f} | {r['loop_s'] * 1e3:.2f} | {copies} | "
            f"{r['memcpy_s'] * 1e3:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", action="store_true", help="also the figures as one JSON object")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("network namespaces need root")
    spec = default_layout()
    per_token = sum(dt.itemsize * int(np.prod(shape)) for dt, shape in layout(spec, 1))
    print(f"default model KV layout {spec}: {per_token:,} bytes a token", flush=True)
    rows = []
    for curve in (False, True):
        lines = measure(spec, args.lengths, args.repeats, curve)
        for length in args.lengths:
            mine = [r for r in lines if r["tokens"] == length]
            seconds = [r["seconds"] for r in mine]
            rows.append({
                "tokens": length, "bytes": mine[0]["bytes"], "curve": curve,
                "repeats": len(mine), "median_s": float(np.median(seconds)),
                "p90_s": float(np.quantile(seconds, 0.9)),
                "loop_s": float(np.median([r["loop_seconds"] for r in mine])),
                "send_views": all(r["send_views"] for r in mine),
                "receive_views": all(r["receive_views"] for r in mine),
                "memcpy_s": memcpy_s(mine[0]["bytes"]),
            })  # fmt: skip
    print(table(rows))
    if args.json:
        print(json.dumps({"layout": spec, "bytes_per_token": per_token, "rows": rows}))


if __name__ == "__main__":
    main()
