"""The cluster file: what it accepts, and a clear error for what it does not."""

from __future__ import annotations

import pytest

from splitserve.config import config_from_dict, config_to_dict


def test_cluster_cpus_round_trip_to_children():
    cpus = {"decode": [0], "detok": [1, 2]}
    config = config_from_dict({"cluster": {"run_dir": "/tmp/x", "cpus": cpus}})
    assert config.cpus == {"decode": (0,), "detok": (1, 2)}
    assert config_from_dict(config_to_dict(config)).cpus == config.cpus


@pytest.mark.parametrize(
    "cpus, message",
    [
        ({"decoder": [0]}, "unknown role 'decoder'"),
        ({"decode": []}, "non-empty list of CPU numbers"),
        ({"decode": [-1]}, "non-empty list of CPU numbers"),
        ({"decode": ["0"]}, "non-empty list of CPU numbers"),
        ({"decode": 0}, "non-empty list of CPU numbers"),
        ([0, 1], "must be a table"),
    ],
)
def test_cluster_cpus_rejects_bad_tables(cpus, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict({"cluster": {"run_dir": "/tmp/x", "cpus": cpus}})


def test_cluster_cpus_need_processes_mode():
    with pytest.raises(ValueError, match="needs mode = 'processes'"):
        cluster = {"mode": "threads", "run_dir": "/tmp/x", "cpus": {"decode": [0]}}
        config_from_dict({"cluster": cluster})


@pytest.mark.parametrize("ahead", ["auto", 0, 7])
def test_admit_ahead_tokens_takes_auto_or_a_count(ahead):
    raw = {"cluster": {"run_dir": "/tmp/x"}, "router": {"admit_ahead_tokens": ahead}}
    config = config_from_dict(raw)
    assert config.router.admit_ahead_tokens == ahead
    assert config_from_dict(config_to_dict(config)).router.admit_ahead_tokens == ahead


@pytest.mark.parametrize("ahead", ["soon", -1, 1.5, True])
def test_admit_ahead_tokens_rejects_anything_else(ahead):
    with pytest.raises(ValueError, match="admit_ahead_tokens"):
        config_from_dict({"router": {"admit_ahead_tokens": ahead}, "cluster": {"run_dir": "/x"}})
