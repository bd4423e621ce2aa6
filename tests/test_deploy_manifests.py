"""The packaging for the places it runs, checked without running them: the Kubernetes manifests
against the Kubernetes schemas (kubernetes-validate, strict), and consistent with the cluster
file they carry; the systemd units with `systemd-analyze verify`; the probe the manifests run.
(tests/test_image.py builds and runs the OCI image.)"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tomllib

import pytest
import yaml

from splitserve.config import config_from_dict
from splitserve.launch import probe
from tests.http_stack import http_stack, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K8S = os.path.join(ROOT, "deploy", "k8s")
SYSTEMD = os.path.join(ROOT, "deploy", "systemd")


def manifests() -> list[dict]:
    docs = []
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        with open(path) as fh:
            docs += [d for d in yaml.safe_load_all(fh) if d]
    return docs


def test_manifests_pass_the_kubernetes_schemas():
    validate = pytest.importorskip("kubernetes_validate")
    for doc in manifests():
        validate.validate(doc, validate.latest_version(), strict=True)


def test_manifests_match_the_cluster_file_they_carry():
    docs = manifests()
    by_kind: dict[str, dict[str, dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    raw = tomllib.loads(by_kind["ConfigMap"]["splitserve-cluster"]["data"]["cluster.toml"])
    config = config_from_dict(raw)  # the file loads as every role will load it
    services = by_kind["Service"]
    endpoints = [config.addresses.router, *config.addresses.prefill, *config.addresses.decode,
                 *config.addresses.detok]  # fmt: skip
    for endpoint in endpoints:
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        service = services[host.split(".")[-1] if "." in host else host]
        # headless, published before ready: a worker binds its name before its warm-up
        spec = service["spec"]
        assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"], host
        assert int(port) in {p["port"] for p in spec["ports"]}, endpoint
    detok = by_kind["StatefulSet"]["splitserve-detok"]
    assert detok["spec"]["replicas"] == len(config.addresses.detok)  # the pool as replicas
    for role in ("router", "prefill-0", "decode-0"):
        assert f"splitserve-{role}" in by_kind["Deployment"]
    # CURVE over the cluster network: the public keys and only the pod's own secret (the detok
    # pool's StatefulSet shares one template, so its pods hold the pool's secrets)
    assert config.security.keys_dir == "/etc/splitserve/keys"
    own = {"splitserve-router": "router", "splitserve-prefill-0": "prefill-0",
           "splitserve-decode-0": "decode-0", "splitserve-detok": "detok"}  # fmt: skip
    for workload in [*by_kind["Deployment"].values(), detok]:
        pod = workload["spec"]["template"]["spec"]
        (keys,) = [v for v in pod["volumes"] if v["name"] == "keys"]
        secrets = [s["secret"]["name"] for s in keys["projected"]["sources"]]
        assert secrets == ["splitserve-public-keys",
                           f"splitserve-key-{own[workload['metadata']['name']]}"], secrets
        assert keys["projected"]["defaultMode"] == 0o400  # Keyring refuses a secret others read
        (container,) = pod["containers"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert config.security.keys_dir in mounts
        for kind in ("readinessProbe", "livenessProbe"):
            command = " ".join(container[kind]["exec"]["command"])
            assert "splitserve.launch.probe" in command, (workload["metadata"]["name"], kind)


def test_systemd_units_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # the units run /opt/splitserve/venv/bin/python; verify checks that it exists, so point them
    # at this checkout's interpreter
    for path in glob.glob(os.path.join(SYSTEMD, "*")):
        with open(path) as fh:
            text = fh.read().replace("/opt/splitserve/venv/bin/python", sys.executable)
        (tmp_path / os.path.basename(path)).write_text(text)
    units = ["splitserve.target", "splitserve-router.service", "splitserve-prefill@0.service",
             "splitserve-decode@0.service", "splitserve-detok@0.service",
             "splitserve-detok@1.service"]  # fmt: skip
    result = subprocess.run(["systemd-analyze", "verify", *units], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "splitserve" not in result.stderr, result.stderr  # no warning about our units


@pytest.mark.timeout(120)
def test_probe_reads_each_role_from_the_router(tokenizer_512):
    with http_stack(tokenizer_512) as stack:
        url = f"{stack.url}/health"
        for role, index in (("router", 0), ("prefill", 0), ("decode", 0), ("detok", 1)):
            assert probe.healthy(role, index, url, live=False)[0], role
            assert probe.healthy(role, index, url, live=True)[0], role
        assert probe.healthy("detok", 7, url, live=False) == (False, "detok[7] unknown")
        assert probe.main(["decode", "0", "--url", url]) == 0
    # no router: not ready, but a worker is not killed for the router's absence
    assert probe.healthy("decode", 0, url, live=False)[0] is False
    assert probe.healthy("decode", 0, url, live=True)[0] is True
    assert probe.healthy("router", 0, url, live=True)[0] is False


@pytest.mark.timeout(120)
def test_the_liveness_probe_judges_a_worker_by_its_own_progress_record(tokenizer_512):
    """With --config, a worker's progress record in its run_dir decides its liveness, by the
    bounds its launcher judges it by (splitserve/progress.py): a stopped worker is not alive."""
    with http_stack(tokenizer_512, lifecycle={"stuck_timeout_s": 1.0}) as stack:
        url, config = f"{stack.url}/health", stack.config
        argv = ["decode", "0", "--url", url, "--live", "--config", stack.stack.config_path]
        wait_until(lambda: probe.healthy("decode", 0, url, True, config)
                   == (True, "decode[0] making progress"), 60, "the record")  # fmt: skip
        assert probe.main(argv) == 0
        decode = stack.stack.children[("decode", 0)].popen
        decode.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: not probe.healthy("decode", 0, url, True, config)[0], 60,
                       "the probe to find it stopped")  # fmt: skip
            assert "its heartbeat thread has not run" in probe.healthy(
                "decode", 0, url, True, config)[1]
            assert probe.main(argv) == 1
        finally:
            decode.send_signal(signal.SIGCONT)
        wait_until(lambda: probe.healthy("decode", 0, url, True, config)[0], 60, "alive again")
