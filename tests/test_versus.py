"""bench's runner against other servers (splitserve/bench/versus/): what each server spec means,
the command each server gets, and the table's medians and ratios. (The servers themselves run in
the benchmark, not here: they are installed outside the repository, when asked.)"""

from __future__ import annotations

import pytest

from splitserve.bench.versus.run import table
from splitserve.bench.versus.servers import ServerSpec, command


def test_server_specs():
    assert ServerSpec.parse("splitserve") == ServerSpec("splitserve", "splitserve")
    assert ServerSpec.parse("llama-cpp") == ServerSpec("llama-cpp", "llama-cpp")
    assert ServerSpec.parse("vllm=/m/hf") == ServerSpec("vllm", "vllm", "/m/hf")
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
    ours = command(ServerSpec("two", "splitserve", "x.toml"), 8123)
    assert ours[-4:] == ["--port", "8123", "--config", "x.toml"]


def test_the_table_gives_medians_over_rounds_and_ratios_to_the_first_server():
    def row(server, c, tps, p50, failed=0):
        return {"server": server, "concurrency": c, "output_tokens_per_s": tps, "ttft_p50": p50,
                "ttft_p90": p50 * 2, "failed": failed}  # fmt: skip

    rows = [row("a", 1, 10.0, 0.1), row("a", 1, 30.0, 0.3), row("a", 1, 20.0, 0.2),
            row("b", 1, 40.0, 0.5), row("b", 1, 60.0, 0.7, failed=1)]  # fmt: skip
    lines = table(rows, ["a", "b"]).splitlines()
    assert lines[2] == "| 1 | a | 3 | 20.0 | 1.00x | 0.20 | 0.40 |"
    assert lines[3] == "| 1 | b (1 failed) | 2 | 50.0 | 2.50x | 0.60 | 1.20 |"
