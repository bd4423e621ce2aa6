"""The API key stays secret: it was once written in clear into a 0644 cluster.toml and
showed in /proc/PID/cmdline. Now `splitserve serve` reads it from SPLITSERVE_API_KEY or
--api-key-file (0600), no process of the stack has it on its command line or in the children's
cluster file, the router reads it from a 0600 file beside that, the workers' environments do
not hold it, and --api-key is refused with the reason."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from splitserve.config import load_config
from splitserve.launch.ports import free_port
from tests.test_serve_command import children_of

KEY = "sk-test-7f3a9c1e5b2d48e6a0c4"


def _serve(tokenizer: str, port: int, extra: list[str], env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "splitserve", "serve", "--engine", "fake", "--tokenizer",
           tokenizer, "--port", str(port), "--ready-timeout", "120", *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip


def _status(url: str, key: str | None) -> int:
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize("source", ["environment", "file"])
def test_the_key_is_on_no_command_line_and_in_no_shared_file(tokenizer_512, tmp_path, source):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "SPLITSERVE_API_KEY"}
    extra: list[str] = []
    if source == "environment":
        env["SPLITSERVE_API_KEY"] = KEY
    else:
        key_file = tmp_path / "api_key"
        key_file.write_text(KEY + "\n")
        key_file.chmod(0o600)
        extra = ["--api-key-file", str(key_file)]
    proc = _serve(tokenizer_512, port, extra, env)
    try:
        deadline = time.monotonic() + 120
        while "ready on" not in proc.stdout.readline():
            assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
        pids = children_of(proc.pid) | {proc.pid}
        assert len(pids) == 6  # the launcher and its five children
        config_path = None
        for pid in pids:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode().split("\0")
            assert KEY not in " ".join(argv), argv
            if "--config" in argv:
                config_path = argv[argv.index("--config") + 1]
            if pid != proc.pid and argv[argv.index("-m") + 1] != "router":
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    assert KEY.encode() not in fh.read()  # the workers never see it
        assert config_path is not None
        with open(config_path) as fh:
            assert KEY not in fh.read()
        assert stat.S_IMODE(os.stat(config_path).st_mode) == 0o600
        key_file = load_config(config_path).router.api_key_file
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        url = f"http://127.0.0.1:{port}/v1/completions"
        assert _status(url, None) == 401 and _status(url, "wrong") == 401
        assert _status(url, KEY) == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not os.path.exists(key_file)  # with the run directory it lived in
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_key_on_the_command_line_is_refused_with_the_reason(tokenizer_512):
    out = subprocess.run(
        [sys.executable, "-m", "splitserve", "serve", "--engine", "fake", "--tokenizer",
         tokenizer_512, "--api-key", KEY], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert "--api-key is gone" in out.stderr and "--api-key-file" in out.stderr


def test_a_key_file_or_a_cluster_file_with_the_key_that_others_can_read_is_refused(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    key_file.chmod(0o644)
    conf = tmp_path / "cluster.toml"
    conf.write_text(f'[cluster]\nrun_dir = "{tmp_path}/run"\n[router]\napi_key_file = "key"\n')
    with pytest.raises(ValueError, match="readable by its owner only"):
        load_config(str(conf))
    key_file.chmod(0o600)
    assert load_config(str(conf)).router.api_key == KEY  # relative to the cluster file
    conf.write_text(f'[cluster]\nrun_dir = "{tmp_path}/run"\n[router]\napi_key = "{KEY}"\n')
    conf.chmod(0o644)
    with pytest.raises(ValueError, match="readable by its owner only"):
        load_config(str(conf))
    conf.chmod(0o600)
    assert load_config(str(conf)).router.api_key == KEY
