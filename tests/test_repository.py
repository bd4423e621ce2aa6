"""The repository as a clone gets it (`git ls-files`): no file names a path of the machine it was
made on (the checkout's own folder or its parent, a home folder, an absolute virtual environment,
a /tmp file of one run) or a package registry's host, and the installed packages carry no part
of the laboratory (lab/, tests/).

Allowed: loopback URLs in build files, and the product's own default run directory
(`/tmp/splitserve`, deploy/one-host.toml's `run_dir`: a configuration value, not a path of one
machine). Tests may name /tmp paths: configuration values they parse and never create (`run_dir =
"/tmp/x"`, `ipc:///tmp/r`).
"""

from __future__ import annotations

import configparser
import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()

# package registries and mirrors: a machine's own settings name them (pip.conf, apt sources,
# registries.conf), never the repository
REGISTRY_HOSTS = (
    "pypi.org", "pypi.python.org", "files.pythonhosted.org", "test.pypi.org",
    "deb.debian.org", "security.debian.org", "ftp.debian.org", "snapshot.debian.org",
    "archive.ubuntu.com", "security.ubuntu.com", "ports.ubuntu.com",
    "docker.io", "registry-1.docker.io", "index.docker.io", "quay.io", "ghcr.io", "gcr.io",
    "registry.k8s.io", "registry.npmjs.org", "download.pytorch.org", "conda.anaconda.org",
    "repo.anaconda.com", "proxy.golang.org", "crates.io", "huggingface.co",
)  # fmt: skip
# build and CI files may fetch from nowhere but loopback (as CI's own check reads them)
BUILD_FILES = ("Makefile", ".ci/*", "*.sh", "*.toml", "setup.*", "*ontainerfile*")
LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
PRODUCT_TMP_PATHS = ("/tmp/splitserve",)

NOT_AFTER = r"(?<![\w.~<-])"  # a path's start, not the middle of a word or of a relative path
HOME = re.compile(NOT_AFTER + r"(/home/[\w.-]+/|/Users/[\w.-]+/|/root/)")
ABSOLUTE_ENV = re.compile(NOT_AFTER + r"/[^\s\"'`]*?/(\.venv|site-packages)/")
TMP_FILE = re.compile(NOT_AFTER + r"/tmp/[\w.-]+")
URL = re.compile(r"https?://([\w.-]+|\[[0-9a-fA-F:]+\])")


def toplevel() -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=HERE.parent,
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        pytest.skip("not a git checkout (an unpacked sdist): nothing tracked to read")
    return Path(out.stdout.strip())


def tracked(top: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=top, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def findings(path: str, text: str, machine_dirs: tuple[str, ...]) -> list[str]:
    """What in one file's text names a machine's path or a registry's host."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{number}"
        found += [f"{where}: this machine's folder {d}" for d in machine_dirs if d in line]
        found += [f"{where}: home folder {m.group(0)}" for m in HOME.finditer(line)]
        found += [f"{where}: absolute environment {m.group(0)}"
                  for m in ABSOLUTE_ENV.finditer(line)]
        if not path.startswith("tests/"):
            found += [f"{where}: a /tmp file {m.group(0)}" for m in TMP_FILE.finditer(line)
                      if m.group(0) not in PRODUCT_TMP_PATHS]  # fmt: skip
        for host in URL.findall(line):
            if host in REGISTRY_HOSTS or host.endswith(tuple("." + h for h in REGISTRY_HOSTS)):
                found.append(f"{where}: registry host {host}")
            elif any(fnmatch.fnmatch(path, g) for g in BUILD_FILES) and host not in LOOPBACK:
                found.append(f"{where}: a build file fetches from {host}")
        found += [f"{where}: registry host {h}" for h in REGISTRY_HOSTS
                  if re.search(rf"(?<![\w.-]){re.escape(h)}(?![\w-])", line)
                  and f"://{h}" not in line]  # fmt: skip
    return found


def machine_dirs(top: Path) -> tuple[str, ...]:
    """The checkout's own folder and the one above it, as absolute paths with a slash."""
    return tuple(f"{d}/" for d in (top, top.parent) if str(d) != "/")


def test_no_tracked_file_names_a_machine_path_or_a_registry_host():
    top = toplevel()
    files = tracked(top)
    # not vacuous: the listing is the repository's
    assert len(files) > 100 and {"README.md", "setup.cfg", "Makefile"} <= set(files)
    me = str(HERE.relative_to(top))
    found, read = [], 0
    for path in files:
        if path == me:  # it names the hosts it looks for
            continue
        data = (top / path).read_bytes() if (top / path).is_file() else b""
        if b"\0" in data:  # binary (plots)
            continue
        read += 1
        found += findings(path, data.decode("utf-8", "replace"), machine_dirs(top))
    assert read > 100
    assert not found, "\n".join(found[:30])


def test_the_rules_find_what_they_are_for():
    """Each rule catches its case (so the test above cannot pass for want of a working rule),
    and the allow-list lets the product's defaults and loopback through."""
    top = Path("/srv/checkouts/main")
    dirs = machine_dirs(top)
    bad = {
        "a.md": "see /srv/checkouts/shared/notes.txt",
        "b.md": "python /home/alice/x.py and /root/.cache/y",
        "c.json": '{"model": "/opt/build/.venv/lib/python3.11/site-packages/m.gguf"}',
        "d.md": "printf x > /tmp/cfg/f.toml",
        "Makefile": "debootstrap bookworm $$root http://mirror.example/debian",
        "e.md": "pip install --index-url https://pypi.org/simple x",
        "Containerfile": "ARG BASE=docker.io/library/debian:bookworm-slim",
    }
    for path, text in bad.items():
        assert findings(path, text, dirs), path
    good = {
        "deploy/one-host.toml": 'run_dir = "/tmp/splitserve"',
        "tests/test_x.py": 'config_from_dict({"cluster": {"run_dir": "/tmp/x"}})',
        "Makefile": "curl http://127.0.0.1:8000/health",
        "README.md": "`.venv/bin/python -m lab.suite`, ~/.cache/splitserve/competitors/x",
        "lab/x.json": '{"model": ".venv/lib/python3.11/site-packages/m.gguf"}',
        "deploy/Containerfile": "ARG BASE=debian:bookworm-slim",
    }
    for path, text in good.items():
        assert not findings(path, text, dirs), (path, findings(path, text, dirs))


def test_the_wheel_ships_no_laboratory():
    """setup.cfg's packages are the product's alone: no lab/, no tests/, and `splitserve bench`
    without the suite or the competitor runners."""
    setuptools = pytest.importorskip("setuptools")
    top = toplevel()
    cfg = configparser.ConfigParser()
    cfg.read(top / "setup.cfg")
    include = cfg["options.packages.find"]["include"].split()
    packages = setuptools.find_packages(where=str(top), include=include)
    assert {"splitserve", "splitserve.bench", "router", "decode_worker"} <= set(packages)
    shipped = [p for p in packages if p.split(".")[0] in ("lab", "tests", "bench")]
    assert not shipped, shipped
    assert not [p for p in packages if p.startswith(("splitserve.bench.suite",
                                                     "splitserve.bench.versus"))]  # fmt: skip
