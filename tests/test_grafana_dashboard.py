"""The Grafana dashboard in deploy/grafana: every query names a metric the server exports, and a
real Prometheus (Debian's `prometheus` package), scraping a real stack under load, answers every
query with data. Rendering a panel needs a Grafana server, which neither Debian's archive nor
PyPI ships: that part is skipped, saying so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time

import httpx
import pytest
import yaml

from splitserve.launch.ports import free_port
from tests.http_stack import http_stack

pytestmark = pytest.mark.timeout(240)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "splitserve-dashboard.json")
PROVISIONING = os.path.join(ROOT, "deploy", "grafana", "provisioning")
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "label_values", "topk", "bottomk", "clamp_min", "clamp_max", "abs", "delta",
}  # fmt: skip


def dashboard_queries() -> list[str]:
    with open(DASHBOARD) as fh:
        dash = json.load(fh)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers outside label matchers, ranges,
    strings and by/without lists that are not PromQL's own words."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without)\s*\([^)]*\)", " ", text)
    text = re.sub(r"label_values\(([^,]+),[^)]*\)", r"\1", text)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"\d+", n)}


def as_prometheus_query(expr: str) -> str:
    """What Grafana sends: its variables filled in."""
    return expr.replace("$__rate_interval", "30s").replace("$model_name", ".*")


class Load:
    """Requests, one after another in a thread, until stopped."""

    def __init__(self, url: str):
        self.url = url
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        body = {"prompt": "load", "max_tokens": 8, "ignore_eos": True}
        while not self.done.is_set():
            httpx.post(f"{self.url}/v1/completions", json=body, timeout=30)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    with http_stack(tokenizer_512, model={"fake_step_s": 0.002}) as s:
        yield s


def test_the_dashboard_is_provisioned_by_the_file_beside_it():
    with open(os.path.join(PROVISIONING, "dashboards", "splitserve.yaml")) as fh:
        provider = yaml.safe_load(fh)["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"].endswith("splitserve")
    with open(os.path.join(PROVISIONING, "datasources", "prometheus.yaml")) as fh:
        assert yaml.safe_load(fh)["datasources"][0]["type"] == "prometheus"
    titles = {p["title"] for p in json.load(open(DASHBOARD))["panels"]}
    for wanted in ("Time to first token", "Inter-token latency", "Token throughput",
                   "Requests running and queued", "Decode batch fill (tokens per step over slots)",
                   "Decode step gap", "Worker liveness (1 = ready)"):  # fmt: skip
        assert wanted in titles


def test_every_query_names_a_metric_the_server_exports(stack):
    with Load(stack.url):
        time.sleep(0.5)  # a few requests, so that every histogram has samples
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
                if line and not line.startswith("#")}  # fmt: skip
    queries = dashboard_queries()
    assert len(queries) > 15
    for expr in queries:
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, (expr, names - exported)


def test_a_real_prometheus_answers_every_dashboard_query(stack, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus is not installed (apt-get install prometheus; make ops-test does)")
    port = free_port()
    host_port = stack.url.split("//", 1)[1]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: splitserve\n"
        f"    static_configs:\n      - targets: ['{host_port}']\n"
    )
    prom = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"),
    )  # fmt: skip
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        with Load(stack.url):
            pending = {expr: as_prometheus_query(expr) for expr in dashboard_queries()}
            deadline = time.monotonic() + 300
            while pending and time.monotonic() < deadline:
                for expr, query in list(pending.items()):
                    if answered(api, query):
                        del pending[expr]
                time.sleep(0.5)
        assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert not pending, f"no data for: {sorted(pending)}"
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()


def answered(api: str, query: str) -> bool:
    """The query is valid and returns at least one series (or label value)."""
    try:
        if query.startswith("label_values("):
            metric, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query).groups()
            r = httpx.get(f"{api}/label/{label}/values", params={"match[]": metric}, timeout=5)
        else:
            r = httpx.get(f"{api}/query", params={"query": query}, timeout=5)
    except httpx.HTTPError:
        return False  # not up yet
    if r.status_code == 503:  # Prometheus starting: "Service Unavailable", not JSON
        return False
    body = r.json()
    assert body["status"] == "success", (query, body)
    data = body["data"]
    return bool(data if isinstance(data, list) else data["result"])


def test_grafana_renders_a_panel():
    if shutil.which("grafana-server") is None and shutil.which("grafana") is None:
        pytest.skip("no Grafana server can be installed here: Debian's archive has no Grafana "
                    "package and PyPI has none that runs one; render by hand (deploy/grafana)")
    pytest.skip("a Grafana binary was found, but rendering needs its image renderer plugin")
