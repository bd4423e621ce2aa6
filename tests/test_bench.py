"""The benchmark tooling: statistics on known data, the SSE and /metrics parsers, load shapes,
and one small end-to-end run of `splitserve bench` against a real fake-engine stack that checks
the JSON, Markdown and PNG reports are produced and well-formed (never a timing)."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import subprocess
import sys
import time

import pytest

from splitserve.bench import scrape
from splitserve.bench.__main__ import main as bench_main
from splitserve.bench.client import RequestResult, _event
from splitserve.bench.load import LoadSpec, run_load
from splitserve.bench.prompts import PromptFactory
from splitserve.bench.stats import distribution, histogram_quantile, summarize
from splitserve.launch.ports import free_port
from splitserve.tokenizers import load_tokenizer
from tests.http_stack import http_stack

# -- statistics ------------------------------------------------------------------------------


def test_distribution_figures():
    d = distribution([0.1, 0.2, 0.3, 0.4, 1.0])
    assert d["count"] == 5
    assert d["mean"] == pytest.approx(0.4)
    assert d["p50"] == pytest.approx(0.3)
    assert d["p90"] == pytest.approx(0.76)
    assert d["max"] == 1.0
    assert math.isnan(distribution([])["p99"])


def test_histogram_quantile_matches_prometheus_interpolation():
    bounds = [1.0, 2.0, 4.0]
    counts = [10, 10, 20, 0]  # 40 samples, none above 4
    assert histogram_quantile(bounds, counts, 0.25) == pytest.approx(1.0)
    assert histogram_quantile(bounds, counts, 0.5) == pytest.approx(2.0)
    assert histogram_quantile(bounds, counts, 0.75) == pytest.approx(3.0)  # half-way in (2, 4]
    assert histogram_quantile(bounds, counts, 0.125) == pytest.approx(0.5)  # lower bound 0
    assert histogram_quantile(bounds, [0, 0, 1, 3], 0.9) == 4.0  # +Inf: the largest bound
    assert math.isnan(histogram_quantile(bounds, [0, 0, 0, 0], 0.5))


def _result(index, start, chunks, tokens, ok=True):
    return RequestResult(
        index=index, ok=ok, start=start, ttft=chunks[0] if chunks else None,
        e2e=chunks[-1] if chunks else None, chunk_times=list(chunks), prompt_tokens=10,
        completion_tokens=tokens, usage_reported=True, error=None if ok else "HTTP 503: busy",
    )  # fmt: skip


def test_summarize_counts_usage_tokens_and_latencies():
    results = [
        _result(0, 0.0, [0.1, 0.2, 0.3, 0.5], 4),
        _result(1, 0.0, [0.2, 0.4, 0.6, 0.8], 8),  # 8 tokens in 4 chunks
        _result(2, 0.0, [], 0, ok=False),
    ]
    s = summarize(results, duration_s=2.0)
    assert (s["requests_ok"], s["requests_failed"]) == (2, 1)
    assert s["errors"] == {"HTTP 503: busy": 1}
    assert s["output_tokens"] == 12 and s["output_tokens_per_s"] == pytest.approx(6.0)
    assert s["requests_per_s"] == pytest.approx(1.0)
    assert s["ttft_s"]["mean"] == pytest.approx(0.15)
    assert s["e2e_s"]["max"] == pytest.approx(0.8)
    assert s["itl_s"]["count"] == 6  # gaps 0.1, 0.1, 0.2 and 0.2, 0.2, 0.2
    assert s["itl_s"]["mean"] == pytest.approx(1.0 / 6)
    assert s["itl_s"]["max"] == pytest.approx(0.2)
    assert s["first_gap_s"]["count"] == 2  # first to second chunk: 0.1 and 0.2
    assert s["first_gap_s"]["mean"] == pytest.approx(0.15)
    # tpot: (0.5 - 0.1) / 3 and (0.8 - 0.2) / 7
    assert s["tpot_s"]["mean"] == pytest.approx(((0.4 / 3) + (0.6 / 7)) / 2)


# -- parsers ---------------------------------------------------------------------------------


def test_sse_events_give_text_times_finish_and_usage():
    r = RequestResult(index=0)
    chunk = {"choices": [{"index": 0, "text": "h\u00e9llo \U0001f680", "finish_reason": None}]}
    assert not _event(b"data: " + json.dumps(chunk).encode(), 0.01, r)
    assert not _event(b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}',
                      0.02, r)  # fmt: skip
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}'
    assert not _event(usage, 0.03, r)
    assert _event(b"data: [DONE]", 0.04, r)
    assert r.ttft == 0.01 and r.chunk_times == [0.01] and r.text_chars == 7
    assert r.finish_reason == "length"
    assert (r.prompt_tokens, r.completion_tokens, r.usage_reported) == (5, 9, True)
    with pytest.raises(ValueError, match="overloaded"):
        _event(b'data: {"error":{"message":"overloaded"}}', 0.05, r)


METRICS_BEFORE = """# HELP splitserve_decode_step_gap_seconds gap
# TYPE splitserve_decode_step_gap_seconds histogram
splitserve_decode_step_gap_seconds_bucket{index="0",le="0.001"} 5.0
splitserve_decode_step_gap_seconds_bucket{index="0",le="0.01"} 5.0
splitserve_decode_step_gap_seconds_bucket{index="0",le="+Inf"} 5.0
splitserve_decode_step_gap_seconds_count{index="0"} 5.0
splitserve_decode_step_gap_seconds_sum{index="0"} 0.0025
vllm:generation_tokens_total{model_name="m",engine="0"} 100.0
splitserve_decode_slots{index="0"} 16.0
splitserve_decode_steps_total{index="0"} 10.0
splitserve_decode_tokens_total{index="0"} 80.0
"""
METRICS_AFTER = """splitserve_decode_step_gap_seconds_bucket{index="0",le="0.001"} 5.0
splitserve_decode_step_gap_seconds_bucket{index="0",le="0.01"} 105.0
splitserve_decode_step_gap_seconds_bucket{index="0",le="+Inf"} 105.0
splitserve_decode_step_gap_seconds_count{index="0"} 105.0
splitserve_decode_step_gap_seconds_sum{index="0"} 0.5025
splitserve_decode_step_gap_seconds_recent{index="0",quantile="0.5"} 0.004
splitserve_decode_step_gap_seconds_recent{index="0",quantile="0.99"} 0.009
vllm:generation_tokens_total{model_name="m",engine="0"} 1124.0
splitserve_decode_slots{index="0"} 16.0
splitserve_decode_steps_total{index="0"} 110.0
splitserve_decode_tokens_total{index="0"} 1280.0
"""


def test_metrics_delta_gives_the_runs_step_gap():
    before = scrape.parse_prometheus(METRICS_BEFORE)
    after = scrape.parse_prometheus(METRICS_AFTER)
    figures = scrape.server_figures(before, after)
    gap = figures["step_gap"]
    assert gap["count"] == 100  # the 5 steps before the run are not counted
    assert gap["mean"] == pytest.approx(0.005)
    assert gap["p50"] == pytest.approx(0.001 + 0.009 * 0.5)  # interpolated inside (1 ms, 10 ms]
    assert figures["step_gap_recent"] == {"p50": 0.004, "p99": 0.009}
    assert figures["server_generation_tokens"] == 1024
    assert figures["step_time"] is None  # absent from this exposition
    assert figures["batch_fill"] == pytest.approx(1200 / (100 * 16))  # tokens / (steps x slots)
    restarted = scrape.server_figures(after, before)  # counters went down: after alone counts
    assert restarted["step_gap"]["count"] == 5


# -- loads and prompts -----------------------------------------------------------------------


def _fake_send(in_flight: list[int], peak: list[int]):
    async def send(index: int) -> RequestResult:
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.005)
        in_flight[0] -= 1
        return _result(index, time.perf_counter(), [0.001, 0.002], 2)

    return send


@pytest.mark.parametrize("spec", [LoadSpec(20, concurrency=4), LoadSpec(20, rate=2000.0),
                                  LoadSpec(20, concurrency=3, rate=2000.0)])  # fmt: skip
def test_loads_send_every_request_once_within_the_cap(spec):
    in_flight, peak = [0], [0]
    results, duration = asyncio.run(run_load(spec, _fake_send(in_flight, peak)))
    assert sorted(r.index for r in results) == list(range(20))
    assert duration > 0
    if spec.concurrency:
        assert peak[0] <= spec.concurrency
    with pytest.raises(ValueError):
        LoadSpec(0, concurrency=1)


def test_prompts_are_sized_exactly_with_a_tokenizer(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    for unicode in (False, True):
        factory = PromptFactory(48, unicode=unicode, tokenizer=tok, seed=3)
        prompts = [factory.prompt(i) for i in range(5)]
        assert len(set(prompts)) == 5
        assert [factory.count(p) for p in prompts] == [48] * 5
        assert factory.prompt(2) == prompts[2]  # repeatable
    plain = PromptFactory(30, unicode=True).prompt(0)
    assert any(len(ch.encode()) > 1 for ch in plain)


# -- end to end --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_stack(tokenizer_512):
    """A whole processes-mode stack with the fake engine, on a free port; always stopped."""
    with http_stack(tokenizer_512) as stack:
        yield stack.url


def test_bench_reports_against_a_fake_stack(fake_stack, tokenizer_512, tmp_path):
    out_json, out_md, plot_dir = tmp_path / "b.json", tmp_path / "b.md", tmp_path / "plots"
    rc = bench_main([
        "--url", fake_stack, "--concurrency", "1,4", "--num-requests", "3,8",
        "--prompt-tokens", "24", "--output-tokens", "12", "--tokenizer", tokenizer_512,
        "--unicode-prompts", "--stop", "\u00e9zz", "--stop", "###", "--no-progress",
        "--warmup-requests", "1", "--out-json", str(out_json), "--out-md", str(out_md),
        "--plot-dir", str(plot_dir), "--request-timeout", "30",
    ])  # fmt: skip
    assert rc == 0
    report = json.loads(out_json.read_text())
    runs = report["runs"]
    assert [r["concurrency"] for r in runs] == [1, 4]
    for run, n in zip(runs, (3, 8), strict=True):
        assert (run["requests_ok"], run["requests_failed"]) == (n, 0)
        assert run["usage_reported"]
        assert run["mean_prompt_tokens"] == 24  # sized exactly, as the server counts them
        assert 0 < run["output_tokens"] <= 12 * n  # a stop string may end one early
        for key in ("ttft_s", "e2e_s"):
            d = run[key]
            assert d["count"] == n and 0 < d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
        assert run["output_tokens_per_s"] > 0
        server = run["server"]
        assert server["available"] and server["step_gap"] is not None
        assert server["server_generation_tokens"] >= run["output_tokens"]
    md = out_md.read_text()
    assert "| concurrency 4 | 8 / 0 |" in md and "![latency_cdf.png](plots/latency_cdf.png)" in md
    for name in ("latency_cdf.png", "throughput_vs_load.png"):
        data = (plot_dir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 300 and height > 200


def test_output_spread_draws_lengths_around_the_mean_and_repeats():
    from splitserve.bench.runner import BenchSettings, output_length

    fixed = BenchSettings(output_tokens=100)
    assert {output_length(fixed, i) for i in range(50)} == {100}
    spread = BenchSettings(output_tokens=100, output_spread=0.5, seed=3)
    lengths = [output_length(spread, i) for i in range(400)]
    assert min(lengths) >= 50 and max(lengths) <= 150 and len(set(lengths)) > 50
    assert 90 <= sum(lengths) / len(lengths) <= 110
    assert lengths == [output_length(spread, i) for i in range(400)]  # same seed, same draw
    with pytest.raises(ValueError, match="output-spread"):
        BenchSettings(output_spread=1.0).loads()


def test_bench_with_output_spread_against_a_fake_stack(fake_stack, tokenizer_512, tmp_path):
    out_json = tmp_path / "b.json"
    rc = bench_main([
        "--url", fake_stack, "--concurrency", "4", "--num-requests", "12",
        "--prompt-tokens", "16", "--output-tokens", "20", "--output-spread", "0.5",
        "--tokenizer", tokenizer_512, "--no-progress", "--warmup-requests", "0",
        "--out-json", str(out_json), "--request-timeout", "30",
    ])  # fmt: skip
    assert rc == 0
    (run,) = json.loads(out_json.read_text())["runs"]
    assert run["requests_ok"] == 12
    from splitserve.bench.runner import BenchSettings, output_length

    settings = BenchSettings(output_tokens=20, output_spread=0.5)
    offset = 1_000_000  # the first load's prompt (and length) indexes
    assert run["output_tokens"] == sum(output_length(settings, offset + i) for i in range(12))


def test_bench_fails_clearly_without_a_server(capsys):
    rc = bench_main(["--url", f"http://127.0.0.1:{free_port()}", "--no-progress"])
    assert rc == 2
    assert "no server at" in capsys.readouterr().err


def test_ceiling_with_the_fake_engine(tmp_path):
    out = tmp_path / "ceiling.json"
    rc = bench_main(["--ceiling", "--engine", "fake", "--slots", "4", "--context", "40",
                     "--steps", "20", "--prompt-tokens", "16", "--max-seq-len", "128",
                     "--vocab-size", "512", "--out-json", str(out)])  # fmt: skip
    assert rc == 0
    c = json.loads(out.read_text())
    assert c["slots"] == 4 and c["tokens_per_s"] > 0
    assert 0 < c["step_s"]["p50"] and c["prefill_s"]["p50"] > 0


def test_ceiling_times_prefill_after_idle_and_records_sampling_when_asked(tmp_path, capsys):
    out = tmp_path / "ceiling.json"
    rc = bench_main(["--ceiling", "--engine", "fake", "--slots", "2", "--context", "20",
                     "--steps", "5", "--prompt-tokens", "8", "--max-seq-len", "64",
                     "--vocab-size", "512", "--prefill-idle-ms", "1", "--temperature", "0.7",
                     "--top-k", "5", "--out-json", str(out)])  # fmt: skip
    assert rc == 0
    c = json.loads(out.read_text())
    assert c["prefill_idle_s"] == 0.001 and c["prefill_after_idle_s"]["min"] > 0
    assert c["sampling"] == {"temperature": 0.7, "top_p": 1.0, "top_k": 5}
    assert "after 1 ms idle" in capsys.readouterr().out


def test_ceiling_probe_measures_once_per_line_until_stdin_ends():
    cmd = [sys.executable, "-m", "splitserve.bench", "--ceiling", "--probe", "--engine", "fake",
           "--slots", "4", "--context", "40", "--steps", "10", "--prompt-tokens", "16",
           "--max-seq-len", "128", "--vocab-size", "512"]  # fmt: skip
    proc = subprocess.run(cmd, input="measure\nmeasure\n", capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["slots"] == second["slots"] == 4
    assert 0 < first["tokens_per_s"] and first["measured_at"] <= second["measured_at"]


def test_bench_drives_the_chat_endpoint(fake_stack, tokenizer_512, tmp_path):
    """--endpoint chat: the prompt as a user message through /v1/chat/completions, its text
    read from delta.content; the same figures as for completions."""
    out_json = tmp_path / "chat.json"
    rc = bench_main([
        "--url", fake_stack, "--endpoint", "chat", "--concurrency", "4", "--num-requests", "8",
        "--prompt-tokens", "16", "--output-tokens", "10", "--no-progress",
        "--warmup-requests", "1", "--out-json", str(out_json), "--request-timeout", "30",
    ])  # fmt: skip
    assert rc == 0
    (run,) = json.loads(out_json.read_text())["runs"]
    assert (run["requests_ok"], run["requests_failed"]) == (8, 0)
    assert run["usage_reported"] and run["output_tokens"] == 80  # ignore_eos: all 10 each
    assert run["mean_prompt_tokens"] > 16  # the chat template's tokens come on top
    assert run["ttft_s"]["count"] == 8 and run["output_tokens_per_s"] > 0
    assert run["server"]["server_generation_tokens"] >= 80
