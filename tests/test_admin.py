"""The admin endpoints (router/http/admin.py) with the real router: they take an admin key of
their own, never the clients' API key (with it, any client could ask for 256 detok workers),
are refused altogether without one, saying how to turn them on, refuse a pool this host's
memory cannot hold (router/detok_memory.py), and `splitserve serve` starts the workers of a
grown pool a few at a time (splitserve/launch/detok_pool.py)."""

from __future__ import annotations

import os
import re
import stat

import httpx
import pytest

from router.detok_memory import DETOK_WORKER_ESTIMATE_MIB, MIB, detok_worker_bytes
from splitserve.config import config_from_dict
from splitserve.launch.detok_pool import STARTING_AT_ONCE
from tests.http_stack import assert_error_shape, http_stack
from tests.test_serve_supervises import ADMIN, Serve

CLIENT, OPERATOR = "client-key", "operator-key"
POOL = "/admin/detok-workers"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.timeout(120)
def test_without_an_admin_key_the_admin_endpoints_are_off(tokenizer_512):
    with http_stack(tokenizer_512, router={"api_key": CLIENT}) as stack, stack.http() as http:
        for r in (http.get(POOL, headers=bearer(CLIENT)),
                  http.post(POOL, json={"count": 3}, headers=bearer(CLIENT))):  # fmt: skip
            err = assert_error_shape(r, 403)
            assert err["code"] == "admin_disabled", err
            assert "admin_key_file" in err["message"] and "SPLITSERVE_ADMIN_KEY" in err["message"]
        assert http.get("/v1/models", headers=bearer(CLIENT)).status_code == 200


@pytest.mark.timeout(120)
def test_the_admin_key_opens_them_and_the_clients_key_does_not(tokenizer_512):
    router = {"api_key": CLIENT, "admin_key": OPERATOR}
    with http_stack(tokenizer_512, router=router) as stack, stack.http() as http:
        err = assert_error_shape(http.post(POOL, json={"count": 3}, headers=bearer(CLIENT)), 403)
        assert err["code"] == "admin_key_required"
        for headers in ({}, bearer("wrong")):
            assert assert_error_shape(http.get(POOL, headers=headers), 401)["code"] == \
                "invalid_admin_key"  # fmt: skip
        # the admin key opens no client route
        assert http.get("/v1/models", headers=bearer(OPERATOR)).status_code == 401
        r = http.post(POOL, json={"count": 3}, headers=bearer(OPERATOR))
        assert r.status_code == 200 and r.json()["target"] == 3, r.text
        assert http.get(POOL, headers=bearer(OPERATOR)).json()["target"] == 3
        # the children's file names the key's file (0600), never the key
        cluster = open(stack.stack.config_path).read()
        assert OPERATOR not in cluster and CLIENT not in cluster
        key_file = os.path.join(stack.config.run_dir, "admin_key")
        assert f'admin_key_file = "{key_file}"' in cluster
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600


@pytest.mark.timeout(120)
def test_a_pool_the_host_memory_cannot_hold_is_refused(tokenizer_512):
    """Each new worker counted at 1 TiB: no host holds one more; the same size is taken."""
    router = {"admin_key": OPERATOR, "detok_worker_mib": 1 << 20}
    with http_stack(tokenizer_512, router=router) as stack, stack.http() as http:
        r = http.post(POOL, json={"count": 3}, headers=bearer(OPERATOR))
        err = assert_error_shape(r, 409, "count")
        assert err["code"] == "insufficient_memory"
        assert re.fullmatch(r"3 detok workers need about 1048576 MiB more \(1 new, 1048576 MiB "
                            r"each: \[router\] detok_worker_mib\), and this host has \d+ MiB "
                            r"available", err["message"]), err  # fmt: skip
        assert http.get(POOL, headers=bearer(OPERATOR)).json()["target"] == 2  # unchanged
        r = http.post(POOL, json={"count": 1}, headers=bearer(OPERATOR))  # shrinking: no memory
        assert r.status_code == 200, r.text


@pytest.mark.timeout(120)
def test_a_detok_worker_is_counted_at_its_measured_resident_memory(tokenizer_512):
    with http_stack(tokenizer_512) as stack:
        pid = stack.stack.children[("detok", 0)].popen.pid
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        each, how = detok_worker_bytes([pid, os.getpid()])  # this test's process is no detok
        assert how == "the largest running detok worker's resident memory"
        assert 0.5 * rss < each < 2 * rss  # the same process, moments apart
    assert detok_worker_bytes([os.getpid()]) == (DETOK_WORKER_ESTIMATE_MIB * MIB, "an estimate")
    assert detok_worker_bytes([pid], 100) == (100 * MIB, "[router] detok_worker_mib")


def test_the_admin_key_must_differ_from_the_api_key(tmp_path):
    with pytest.raises(ValueError, match="the admin key must differ from the API key"):
        config_from_dict({"cluster": {"run_dir": str(tmp_path)},
                          "router": {"api_key": "same", "admin_key": "same"}})  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_serve_starts_a_grown_pool_a_few_workers_at_a_time(tokenizer_512, tmp_path):
    serve = Serve(tokenizer_512, tmp_path)
    try:
        serve.wait(lambda: "splitserve: ready on" in serve.log_path.read_text(), "ready")
        target = 2 + 3 * STARTING_AT_ONCE
        r = serve.http.post(POOL, json={"count": target}, headers=ADMIN)
        assert r.status_code == 200, r.text

        def grown() -> bool:
            pool = httpx.get(f"{serve.url}{POOL}", headers=ADMIN, timeout=30).json()["workers"]
            return sum(w["live"] for w in pool) == target

        serve.wait(grown, f"a pool of {target}", timeout_s=240)
        # the log in its order: the launcher's starts and the router's readiness lines
        events = re.findall(r"(starting detok|router\.workers: detok)\[(\d+)\]( ready)?",
                            serve.log_path.read_text())  # fmt: skip
        started, ready, most = set(), set(), 0
        for kind, index, is_ready in events:
            if kind == "starting detok":
                started.add(index)
            elif is_ready:
                ready.add(index)
            most = max(most, len(started - ready))
        assert len(started) == target - 2 and most <= STARTING_AT_ONCE, (most, events)
    finally:
        serve.close()
