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
