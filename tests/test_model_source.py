"""A model path this host cannot load (`--model HuggingFaceTB/SmolLM2-135M`, a hub id, once
started every process, two died with tracebacks, then `serve` exited 1): refused by `splitserve
serve` before any process starts, and by a role process started alone, in one clear line with
what to do instead (splitserve/model_source.py); "default" and random:<preset> stay valid."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from splitserve.config import ModelConfig
from splitserve.launch.ports import free_port
from splitserve.model_source import model_problem

HUB_ID = "HuggingFaceTB/SmolLM2-135M"


def run(cmd: list[str], tmp_path) -> subprocess.CompletedProcess:
    # TMPDIR: where serve would make its run directory, to see that none is left behind
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)  # fmt: skip


@pytest.mark.parametrize("model, says", [
    (HUB_ID, f"model '{HUB_ID}' is neither a file nor a folder: this server downloads nothing"),
    ("random:no-such-preset", "unknown preset 'no-such-preset'"),
])  # fmt: skip
def test_serve_refuses_a_model_it_cannot_load_before_starting_anything(tmp_path, model, says):
    cmd = [sys.executable, "-m", "splitserve", "serve", "--model", model, "--port",
           str(free_port()), "--ready-timeout", "60"]  # fmt: skip
    done = run(cmd, tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert says in done.stderr and "Traceback" not in out, out
    assert "started" not in out, out  # no process of the stack was started
    assert not [p for p in os.listdir(tmp_path) if p.startswith("splitserve-")]


@pytest.mark.parametrize("role", ["prefill_worker", "decode_worker", "router"])
def test_a_role_started_alone_refuses_it_in_one_line(tmp_path, role):
    config = tmp_path / "cluster.toml"
    config.write_text(f"[model]\npath = '{HUB_ID}'\n[cluster]\nrun_dir = '{tmp_path / 'run'}'\n")
    done = run([sys.executable, "-m", role, "--config", str(config)], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"model '{HUB_ID}' is neither a file nor a folder" in lines[0]
    assert "downloads nothing" in lines[0]


def test_what_stays_valid(tmp_path):
    assert model_problem(ModelConfig(path="default")) is None
    assert model_problem(ModelConfig(path="random:test-tiny")) is None
    assert model_problem(ModelConfig(path="random:test-tiny:3")) is None
    folder = tmp_path / "hf"
    folder.mkdir()
    assert model_problem(ModelConfig(path=str(folder))) is None
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert model_problem(ModelConfig(path=str(gguf))) is None
    # a process that loads only the tokenizer needs no weights where the tokenizer is named
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    assert model_problem(ModelConfig(path=HUB_ID, tokenizer=str(tok)), weights=False) is None
    assert "neither a file nor a folder" in model_problem(
        ModelConfig(path=HUB_ID, tokenizer=str(tok)))
    assert "tokenizer 'nope' is neither" in model_problem(ModelConfig(tokenizer="nope"))
