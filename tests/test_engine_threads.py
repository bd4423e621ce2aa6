"""Each engine process gets the XLA thread pool its role's key asks for: [model] cpu_threads for
decode, prefill_cpu_threads for prefill ("auto": half the CPUs, at least one). Counted in a fresh
process (the pool is sized when JAX's CPU client starts) from its threads' names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
from splitserve.config import config_from_dict
from splitserve.engine import build_engine
keys = json.loads(sys.argv[1])
model = config_from_dict({"model": {"path": "random:test-tiny", "num_slots": 2,
                                    "max_seq_len": 64, **keys["model"]},
                          "cluster": {"run_dir": "/x"}}).model
build_engine(model, 512, role=keys["role"])
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(json.dumps(sum(n.startswith("tf_XLAEigen") for n in names)))
"""


def xla_threads(role: str, **model) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps({"role": role, "model": model})],
        capture_output=True, text=True, timeout=300, check=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_each_role_gets_its_thread_count():
    cpus = len(os.sched_getaffinity(0))
    assert xla_threads("prefill") == max(1, cpus // 2)  # "auto"
    assert xla_threads("prefill", prefill_cpu_threads=1) == 1
    assert xla_threads("decode") == cpus  # 0: one per CPU
    assert xla_threads("decode", cpu_threads=1) == 1
