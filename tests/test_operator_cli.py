"""What an operator reads: every flag has help, every environment variable the code reads is in
--help and the README, the served model names, --version, and the JSON log format."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import subprocess
import sys

import pytest

from splitserve import __version__, cli, logfmt
from splitserve.config import config_from_dict
from splitserve.env_vars import ENV_VARS
from splitserve.model_names import accepted_names, served_names, short_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("splitserve", "router", "prefill_worker", "decode_worker", "detok_worker", "deploy")


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    cli.add_serve_args(p)
    return p


def test_every_serve_flag_has_help():
    for action in serve_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and action.help != argparse.SUPPRESS, action.option_strings


def test_max_model_len_is_max_seq_len(tmp_path):
    p = serve_parser()
    assert p.parse_args(["--max-model-len", "512"]).max_seq_len == 512
    args = p.parse_args(["--max-seq-len", "256", "--engine", "fake"])
    assert cli.config_from_args(args, lambda: str(tmp_path)).model.max_seq_len == 256


def test_every_environment_variable_is_documented():
    read = set()
    for top in SOURCES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".py", ".sh", ".conf", ".toml", ".service", ".yaml", "file")):
                    with open(os.path.join(dirpath, f), errors="replace") as fh:
                        read |= set(re.findall(r"SPLITSERVE_[A-Z_]+", fh.read()))
    assert read <= set(ENV_VARS), read - set(ENV_VARS)
    out = subprocess.run([sys.executable, "-m", "splitserve", "serve", "--help"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    with open(os.path.join(ROOT, "README.md")) as fh:
        readme = fh.read()
    for name in ENV_VARS:
        assert name in out, name
        assert name in readme, name


def test_version():
    out = subprocess.run([sys.executable, "-m", "splitserve", "--version"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out.strip() == f"splitserve {__version__}"


@pytest.mark.parametrize(("path", "name"), [
    ("default", "SmolLM2-135M-Instruct"),
    ("/models/Llama-3.2-1B-Instruct.Q4_K_M.gguf", "Llama-3.2-1B-Instruct"),
    ("/models/tiny.gguf", "tiny"),
    ("/models/SmolLM2-360M-Instruct/", "SmolLM2-360M-Instruct"),
    ("random:tiny-7m", "random:tiny-7m"),
])  # fmt: skip
def test_short_model_names(path, name):
    assert short_name(path) == name


def _config(raw: dict):
    return config_from_dict({"cluster": {"run_dir": "/tmp/unused"}, **raw})


def test_served_and_accepted_names():
    config = _config({})
    assert served_names(config) == ("SmolLM2-135M-Instruct",)
    assert {"SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", "default"} <= (
        accepted_names(config)
    )
    named = _config({"router": {"served_model_name": ["a", "b"]}})
    assert served_names(named) == ("a", "b")
    assert _config({"router": {"served_model_name": "one"}}).router.served_model_name == (
        "one",
    )
    with pytest.raises(ValueError, match="served_model_name"):
        _config({"router": {"served_model_name": [""]}})


def test_json_log_lines_carry_the_access_fields():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logfmt.JsonFormatter("router[0]"))
    log = logging.getLogger("test.access.json")
    log.addHandler(handler)
    log.propagate = False
    log.warning("GET / 200", extra={"access": {"status": 200, "request_id": "r1"}})
    line = json.loads(stream.getvalue())
    assert line["process"] == "router[0]" and line["level"] == "warning"
    assert line["message"] == "GET / 200" and line["status"] == 200 and line["request_id"] == "r1"
    with pytest.raises(ValueError):
        logfmt.configure("x", "loud")
