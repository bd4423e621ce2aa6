"""The cluster file is the one source of truth of what runs where: [hosts.NAME] roles
name whole roles or single workers; the shipped supervisord configs are exactly what
`splitserve deploy supervisord` writes from the shipped cluster files (so they cannot drift);
and deploy/launch.sh runs what the file gives its host: here two "hosts" on one machine, one with
the router and prefill worker 0, the other with prefill worker 1 alone."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from splitserve.config import config_from_dict, load_config
from splitserve.deploy.commands import CHECKOUT, default_out, plan_for, supervisord_text
from splitserve.hosts import host_plan, host_plans
from splitserve.launch.ports import free_port
from tests.test_serve_command import children_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy")
SHIPPED = [("one-host.toml", None), ("two-hosts.toml", "prefill-host"),
           ("two-hosts.toml", "decode-host")]  # fmt: skip


@pytest.mark.parametrize("toml, host", SHIPPED)
def test_the_shipped_supervisord_configs_are_what_the_generator_writes(toml, host):
    path = os.path.join(DEPLOY, toml)
    out = default_out(path, host)
    python = os.path.join(CHECKOUT, ".venv", "bin", "python")
    with open(out) as fh:
        shipped = fh.read()
    assert shipped == supervisord_text(path, host, out, python, CHECKOUT), (
        f"{out} differs from what the generator writes: run `make deploy-configs`"
    )


def cluster(hosts: dict, prefill: int = 2, decode: int = 2, detok: int = 4):
    addresses = {
        "router": "ipc:///tmp/r.sock",
        "prefill": [f"ipc:///tmp/p{i}.sock" for i in range(prefill)],
        "decode": [f"ipc:///tmp/d{i}.sock" for i in range(decode)],
        "detok": [f"ipc:///tmp/k{i}.sock" for i in range(detok)],
    }
    return config_from_dict({"addresses": addresses, "hosts": hosts})


def test_a_host_names_whole_roles_or_single_workers():
    config = cluster({"a": {"roles": ["router", "prefill:1", "detok:1-2"]},
                      "b": {"roles": ["decode", "prefill:0", "detok:0", "detok:3"]}})  # fmt: skip
    plans = host_plans(config)
    assert plans["a"].instances == (("router", 0), ("prefill", 1), ("detok", 1), ("detok", 2))
    assert plans["b"].of("decode") == [0, 1] and plans["b"].of("detok") == [0, 3]


@pytest.mark.parametrize(
    "hosts, message",
    [
        ({"a": {"roles": ["prefill:2"]}}, r"'prefill:2': the cluster's prefill workers have "),
        ({"a": {"roles": ["detok:3-1"]}}, "detok workers have indices 0-3"),
        ({"a": {"roles": ["decoder"]}}, "is not ROLE, ROLE:K or ROLE:J-K"),
        ({"a": {"roles": ["detok:x"]}}, "is not ROLE"),
        ({"a": {"roles": ["decode", "decode:1"]}}, "decode:1 is listed twice"),
        ({"a": {"roles": ["detok:0-1"]}, "b": {"roles": ["detok:1"]}},
         r"detok:1 is given to both \[hosts.a\] and \[hosts.b\]"),
        ({"a": {"roles": []}}, "host 'a' has no roles"),
        ({"a": {"roles": ["router"], "cpu": {}}}, "unknown key"),
    ],
)  # fmt: skip
def test_a_bad_host_table_is_refused_with_what_is_wrong(hosts, message):
    with pytest.raises(ValueError, match=message):
        host_plans(cluster(hosts))


def test_the_two_host_defaults_stay():
    config = cluster({}, prefill=1, decode=1, detok=2)
    assert host_plan(config, "prefill-host").roles == ("router", "prefill")
    assert host_plan(config, "decode-host").instances == (("decode", 0), ("detok", 0),
                                                          ("detok", 1))  # fmt: skip


def test_four_hosts_generate_a_config_each_with_their_own_workers(tmp_path):
    path = os.path.join(DEPLOY, "four-hosts.toml")
    config = load_config(path)
    assert sorted(host_plans(config)) == ["decode-a", "decode-b", "prefill-a", "prefill-b"]
    python = os.path.join(CHECKOUT, ".venv", "bin", "python")
    texts = {host: supervisord_text(path, host, str(tmp_path / f"{host}.conf"), python, CHECKOUT)
             for host in host_plans(config)}  # fmt: skip
    programs = {h: re.findall(r"^\[program:(\S+)\]$", t, re.M) for h, t in texts.items()}
    assert programs == {"prefill-a": ["router", "prefill-0"], "prefill-b": ["prefill-1"],
                        "decode-a": ["decode-0", "detok"], "decode-b": ["decode-1", "detok"]}
    decode_b = texts["decode-b"]
    assert "numprocs=2\nnumprocs_start=2\n" in decode_b  # detok workers 2 and 3
    assert "-m detok_worker --config " in decode_b and "--index %(process_num)s" in decode_b
    assert 'environment=SPLITSERVE_CPUS="0",SPLITSERVE_IO_CPUS="1"' in decode_b
    assert "stopasgroup=true" in decode_b and "killasgroup=true" in decode_b
    assert plan_for(config, None).instances[-1] == ("router", 0)  # one machine: everything


def test_launch_sh_starts_what_the_file_gives_each_host(tokenizer_512, tmp_path):
    """Host a: router, prefill 0, decode, detok; host b: prefill 1 alone. Both hosts' launchers
    report ready, and requests are served by both prefill workers."""
    port = free_port()
    conf = tmp_path / "hosts.toml"
    run = tmp_path / "run"
    conf.write_text(f"""
[model]
engine = "fake"
tokenizer = "{tokenizer_512}"
[cluster]
run_dir = "{run}"
[router]
port = {port}
[lifecycle]
heartbeat_interval_s = 0.1
liveness_timeout_s = 1.0
[addresses]
router = "ipc://{run}/router.sock"
prefill = ["ipc://{run}/prefill-0.sock", "ipc://{run}/prefill-1.sock"]
decode = "ipc://{run}/decode-0.sock"
detok = ["ipc://{run}/detok-0.sock", "ipc://{run}/detok-1.sock"]
[hosts.a]
roles = ["router", "prefill:0", "decode", "detok"]
[hosts.b]
roles = ["prefill:1"]
""")
    launch = os.path.join(DEPLOY, "launch.sh")
    env = {**os.environ, "SPLITSERVE_PYTHON": sys.executable}
    procs = {}
    try:
        for host in ("b", "a"):
            procs[host] = subprocess.Popen(
                [launch, host, str(conf), "--log-dir", str(tmp_path / host)], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
        for host, proc in procs.items():
            deadline = time.monotonic() + 120
            while True:
                line = proc.stdout.readline()
                assert line and time.monotonic() < deadline, f"launcher {host} did not get ready"
                if f"host {host} ready" in line:
                    break
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(4):
                r = client.post("/v1/completions", json={"prompt": f"p {i}", "max_tokens": 3})
                assert r.status_code == 200, r.text
            health = client.get("/health").json()
        pids = {(w["role"], w["index"]): w["pid"] for w in health["workers"]}
        on_b = children_of(procs["b"].pid)
        assert on_b == {pids[("prefill", 1)]}  # host b runs prefill 1 and nothing else
        assert not on_b & {pids[("prefill", 0)], pids[("decode", 0)], pids[("detok", 0)]}
        assert {pids[("prefill", 0)], pids[("detok", 1)]} <= children_of(procs["a"].pid)
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
