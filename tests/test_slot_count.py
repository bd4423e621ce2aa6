"""num_slots = "auto": a decode worker's slots are sized from its model's KV cache within
[model] kv_cache_mib (at most [router] max_running), the worker reports them in Ready, and the
router places and admits by what was reported (the cluster file holds no count for it)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from router.requests import RequestParams
from splitserve.cli import add_serve_args, config_from_args
from splitserve.config import config_from_dict
from splitserve.engine import build_engine
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.model.llama_config import preset
from splitserve.engine.slot_count import FAKE_ENGINE_SLOTS, auto_slots
from tests.default_shape import default_model_shape
from tests.pipeline_util import make_config, pipeline, run, wait_for

GIB = 1 << 30


def test_the_default_budget_gives_the_default_model_16_slots_and_a_small_one_64():
    per_token = default_model_shape().kv_bytes_per_token(4)  # the installed checkpoint's
    assert per_token * 2048 == 94_371_840  # 90 MiB a slot at full length
    assert auto_slots(per_token, 2048, 2 * GIB, 64) == 16  # 22 fit: the power of two below
    assert auto_slots(preset("tiny-7m").kv_bytes_per_token(4), 2048, 2 * GIB, 64) == 64


@pytest.mark.parametrize(
    "per_token, budget, most, want",
    [
        (1024, 1024 * 100 * 7, 64, 4),  # 7 fit: 4
        (1024, 1024 * 100 * 8, 64, 8),  # exactly 8
        (1024, 1024 * 100 - 1, 64, 1),  # not even one fits: one still serves
        (1, GIB, 64, 64),  # held to the requests that run at once
        (1, GIB, 48, 32),  # ... rounded down to a power of two
        (1, GIB, 1, 1),
    ],
)
def test_auto_slots_is_the_largest_power_of_two_that_fits(per_token, budget, most, want):
    assert auto_slots(per_token, 100, budget, most) == want


def test_auto_slots_refuses_what_it_cannot_size():
    with pytest.raises(ValueError, match="cannot size slots"):
        auto_slots(0, 100, GIB, 64)


def test_the_cluster_file_defaults_to_auto_and_checks_what_it_is_given():
    config = config_from_dict({"cluster": {"run_dir": "/tmp/x", "decode_workers": 2}})
    assert config.model.num_slots == "auto" and config.model.kv_cache_mib == 2048
    assert config.slots_of(0) == 0  # settled by the worker, reported in its Ready
    assert config.most_slots == 2 * config.router.max_running  # what message sizes allow for
    counted = config_from_dict({"cluster": {"run_dir": "/tmp/x"}, "model": {"num_slots": 8}})
    assert counted.slots_of(0) == 8 and counted.most_slots == 8
    for bad in (0, -1, "many", True, 1.5, 5000):
        with pytest.raises(ValueError, match='num_slots must be "auto" or a count'):
            config_from_dict({"cluster": {"run_dir": "/tmp/x"}, "model": {"num_slots": bad}})
    for bad in (0, -1, "big", True):
        with pytest.raises(ValueError, match="kv_cache_mib must be a size"):
            config_from_dict({"cluster": {"run_dir": "/tmp/x"}, "model": {"kv_cache_mib": bad}})


def test_the_command_line_takes_auto_or_a_count(tmp_path):
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    for given, want in (("auto", "auto"), ("32", 32)):
        args = parser.parse_args(["--engine", "fake", "--tokenizer", "t", "--slots", given])
        assert config_from_args(args, lambda: str(tmp_path)).model.num_slots == want
    with pytest.raises(SystemExit):
        parser.parse_args(["--slots", "lots"])


def test_the_engines_settle_auto():
    # test-tiny: 512 bytes of KV a position, so 32 KiB a slot at 64 positions
    engine = build_jax_engine("random:test-tiny", "auto", 64, kv_cache_bytes=100 << 10,
                              most_slots=64, sides=("decode",))  # fmt: skip
    assert engine.num_slots == 2  # 3 fit
    engine = build_jax_engine("random:test-tiny", "auto", 64, kv_cache_bytes=GIB, most_slots=8,
                              sides=("decode",))  # fmt: skip
    assert engine.num_slots == 8
    model = config_from_dict({"cluster": {"run_dir": "/tmp/x"}, "model": {"engine": "fake"}}).model
    assert build_engine(model, 512).num_slots == FAKE_ENGINE_SLOTS  # no KV cache to size


@pytest.mark.slow
def test_the_router_admits_by_the_slots_a_decode_worker_reports(tokenizer_512):
    """A real decode process settles "auto" at two slots (a budget of 64 KiB, 32 KiB a slot),
    and the router, which the cluster file gave no count, places and admits by those two:
    five requests at once all finish, never more than two decoding at a time."""
    config = make_config(
        tokenizer_512,
        "processes",
        model={"engine": "jax", "path": "random:test-tiny", "num_slots": "auto",
               "kv_cache_mib": 1 / 16, "max_seq_len": 64, "prefix_cache": False,
               "prefill_batch_tokens": 0, "decode_steps": 1},
        lifecycle={"liveness_timeout_s": 5.0},
    )  # fmt: skip
    assert config.slots_of(0) == 0

    async def body():
        async with pipeline(config, ready_s=480) as (core, _):
            assert core.workers.decode_slots(0) == 2 and core.workers.total_decode_slots() == 2
            params = RequestParams(max_tokens=24, temperature=0.0, ignore_eos=True)
            most_running = 0

            async def one(i: int) -> list[int]:
                nonlocal most_running
                handle = await core.submit([5 + i, 7, 11], params)
                most_running = max(most_running, core.admission.running)
                tokens = [t async for d in handle for t in d.token_ids]
                assert handle.result.finish_reason.api == "length"
                return tokens

            streams = await asyncio.gather(*(one(i) for i in range(5)))
            assert [len(t) for t in streams] == [24] * 5
            # two slots, and at most two more admitted ahead for slots about to free (a
            # router that took the default max_running for the slots would admit all five)
            assert most_running <= 4
            # its heartbeats say so too (the first may come after the requests are done)
            decode = core.workers.get("decode", 0)
            await wait_for(lambda: decode.load is not None, 120, "a decode heartbeat")
            assert decode.load.num_slots == 2

    run(body(), timeout_s=600)
