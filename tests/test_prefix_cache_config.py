"""The prefix cache's switch on `splitserve serve` (ours and vLLM's spellings) and its cluster-file
keys, checked at load."""

from __future__ import annotations

import argparse

import pytest

from splitserve import cli
from splitserve.config import config_from_dict


def model_of(tmp_path, *flags: str):
    p = argparse.ArgumentParser()
    cli.add_serve_args(p)
    return cli.config_from_args(p.parse_args(["--engine", "fake", *flags]),
                                lambda: str(tmp_path)).model  # fmt: skip


def test_flags_turn_the_cache_off_and_on(tmp_path):
    assert model_of(tmp_path).prefix_cache is True  # on by default, as vLLM's
    assert model_of(tmp_path, "--no-prefix-cache").prefix_cache is False
    assert model_of(tmp_path, "--no-enable-prefix-caching").prefix_cache is False
    assert model_of(tmp_path, "--enable-prefix-caching").prefix_cache is True


@pytest.mark.parametrize("model, message", [
    ({"prefix_cache_mb": -1}, "prefix_cache_mb"),
    ({"prefix_cache_mb": "lots"}, "prefix_cache_mb"),
    ({"prefix_block_tokens": 0}, "prefix_block_tokens"),
    ({"prefix_block_tokens": 64, "max_seq_len": 64}, "below max_seq_len"),
    ({"prefix_cache": "yes"}, "true or false"),
])  # fmt: skip
def test_bad_cache_keys_fail_at_load(tmp_path, model, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict({"model": {"engine": "fake", **model},
                          "cluster": {"run_dir": str(tmp_path)}})  # fmt: skip


def test_a_fractional_bound_is_taken(tmp_path):
    raw = {"model": {"prefix_cache_mb": 0.01}, "cluster": {"run_dir": str(tmp_path)}}
    assert config_from_dict(raw).model.prefix_cache_mb == 0.01


def test_prefill_buckets_must_end_at_max_seq_len(tmp_path):
    raw = {"model": {"max_seq_len": 256, "prefill_buckets": [64, 256]},
           "cluster": {"run_dir": str(tmp_path)}}  # fmt: skip
    assert tuple(config_from_dict(raw).model.prefill_buckets) == (64, 256)
    raw["model"]["prefill_buckets"] = [64, 128]
    with pytest.raises(ValueError, match="prefill_buckets"):
        config_from_dict(raw)
