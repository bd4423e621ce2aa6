"""The cluster file: what it accepts, and a clear error for what it does not."""

from __future__ import annotations

import socket

import pytest
import zmq

from splitserve.config import bind_address, config_from_dict, config_to_dict


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


# ---- endpoints -------------------------------------------------------------------------------

GOOD = {"router": "tcp://127.0.0.1:5550", "prefill": "tcp://10.0.0.1:5551",
        "decode": "tcp://decode-host.example:5552", "detok": ["ipc:///tmp/d0.sock"]}  # fmt: skip


def _with(**changed):
    # keys: tcp beyond loopback needs them (tests/test_transport_security.py)
    return config_from_dict({"addresses": {**GOOD, **changed}, "security": {"keys_dir": "/k"}})


def test_batching_keys_reach_children_and_the_engine_options():
    from splitserve.engine import batching_options

    raw = {"cluster": {"run_dir": "/tmp/x"},
           "model": {"prefill_batch_tokens": 128, "decode_steps": 8, "num_slots": 4,
                     "decode_steps_max_live": 3, "weight_format": "int8"}}  # fmt: skip
    model = config_from_dict(config_to_dict(config_from_dict(raw))).model
    assert (model.prefill_batch_tokens, model.decode_steps) == (128, 8)
    decode = {"decode_steps": (8,), "decode_steps_max_live": 3, "weight_format": "int8"}
    assert batching_options(model, "decode") == decode
    # counts up to the slots (or to a call of 16-token prompts within the budget)
    prefill = {"prefill_counts": (1, 2, 4), "prefill_batch_tokens": 128,
               "prefill_weight_format": "float32"}  # fmt: skip
    assert batching_options(model, "prefill") == prefill
    assert batching_options(model, None) == {**prefill, **decode}  # benchmarks: both
    alone = config_from_dict({"model": {"prefill_batch_tokens": 0},
                              "cluster": {"run_dir": "/tmp/x"}}).model
    assert batching_options(alone, "prefill")["prefill_counts"] == (1,)  # 0: one prompt a call


@pytest.mark.parametrize("model", [{"prefill_batch_tokens": -1}, {"prefill_batch_tokens": 1.5},
                                   {"prefill_batch_tokens": "256"}, {"decode_steps": 0},
                                   {"decode_steps": 33}, {"decode_steps": True},
                                   {"decode_steps_max_live": -1},
                                   {"decode_steps_max_live": 2.0}, {"huge_pages": "yes"},
                                   {"huge_pages": 1}])  # fmt: skip
def test_batching_keys_are_checked_at_load(model):
    with pytest.raises(ValueError, match="prefill_batch_tokens|decode_steps|huge_pages"):
        config_from_dict({"model": model, "cluster": {"run_dir": "/x"}})


def test_the_weight_formats_are_the_engines_own():
    from splitserve.config.checks import WEIGHT_FORMATS
    from splitserve.engine.kernels.quant import WEIGHT_FORMATS as ENGINE_FORMATS

    assert WEIGHT_FORMATS == ("auto", *ENGINE_FORMATS)
    assert config_from_dict({"cluster": {"run_dir": "/x"}}).model.weight_format == "auto"


@pytest.mark.parametrize("fmt", ["int4", "", 8, "Float32"])
def test_a_weight_format_is_checked_at_load(fmt):
    with pytest.raises(ValueError, match="weight_format must be one of auto, float32"):
        config_from_dict({"model": {"weight_format": fmt}, "cluster": {"run_dir": "/x"}})


def test_the_prefill_weight_formats_are_the_engines_own():
    from splitserve.config.checks import PREFILL_WEIGHT_FORMATS
    from splitserve.engine.kernels.quant import BF16_NATIVE, BF16_XLA

    assert set(PREFILL_WEIGHT_FORMATS) == {"auto", "float32", BF16_XLA, BF16_NATIVE}
    # exact by default: bfloat16 products change some answers (lab/benchmarks.md)
    model = config_from_dict({"cluster": {"run_dir": "/x"}}).model
    assert model.prefill_weight_format == "float32"
    raw = {"model": {"prefill_weight_format": BF16_XLA}, "cluster": {"run_dir": "/x"}}
    assert config_from_dict(config_to_dict(config_from_dict(raw))).model.prefill_weight_format \
        == BF16_XLA


@pytest.mark.parametrize("fmt", ["bfloat16", "int8", "gguf", "", 16, "BFLOAT16-XLA"])
def test_a_prefill_weight_format_is_checked_at_load(fmt):
    with pytest.raises(ValueError, match="prefill_weight_format must be one of auto, float32, "
                                         "bfloat16-xla, bfloat16-native"):  # fmt: skip
        config_from_dict({"model": {"prefill_weight_format": fmt}, "cluster": {"run_dir": "/x"}})


def test_a_renamed_prefill_weight_format_names_its_new_name():
    with pytest.raises(ValueError, match='"bfloat16-amx" is now "bfloat16-native"'):
        config_from_dict({"model": {"prefill_weight_format": "bfloat16-amx"},
                          "cluster": {"run_dir": "/x"}})  # fmt: skip


@pytest.mark.parametrize("flags, want", [
    ({"avx2", "avx512f", "amx_tile", "amx_bf16", "amx_int8"}, "bfloat16-native"),
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16-native"),  # dot products, no tiles
    ({"avx2", "avx512f", "avx512_vnni"}, "float32"),
    ({"avx2", "amx_bf16"}, "float32"),  # a tile flag without the tiles: not usable
    (set(), "float32"),
])  # fmt: skip
def test_auto_prefill_weights_follow_the_cpus_bfloat16_units(flags, want, caplog):
    from splitserve.engine import prefill_weight_format

    auto = config_from_dict({"model": {"prefill_weight_format": "auto"},
                             "cluster": {"run_dir": "/x"}}).model  # fmt: skip
    with caplog.at_level("INFO", logger="splitserve.engine"):
        assert prefill_weight_format(auto, frozenset(flags)) == want
    assert f'prefill_weight_format "auto": {want}' in caplog.text  # the operator sees the pick
    fixed = config_from_dict({"model": {"prefill_weight_format": "float32"},
                              "cluster": {"run_dir": "/x"}}).model  # fmt: skip
    assert prefill_weight_format(fixed, frozenset(flags)) == "float32"


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    from splitserve.engine.kernels.cpu_features import cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n\n"
                    "processor\t: 1\nflags\t\t: fpu\n")  # fmt: skip
    assert cpu_flags(str(info)) == {"fpu", "avx2", "amx_bf16", "amx_tile"}
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_well_formed_endpoints_are_accepted():
    assert _with().addresses.decode == ("tcp://decode-host.example:5552",)
    assert _with(detok=["inproc://d0", "tcp://127.0.0.1:5561"]).detok_count == 2


@pytest.mark.parametrize(
    "changed, message",
    [
        ({"router": "tcp://127.0.0.1:5755x"}, r"\[addresses\] router: .*port from 1 to 65535"),
        ({"router": "tcp://127.0.0.1:0"}, "port from 1 to 65535"),
        ({"router": "tcp://127.0.0.1:65536"}, "port from 1 to 65535"),
        ({"router": "tcp://127.0.0.1"}, "port from 1 to 65535"),
        ({"router": "tcp://*:5550"}, "neither an IPv4 address nor a host name"),
        ({"router": "tcp://10.0.0.256:5550"}, "neither an IPv4 address nor a host name"),
        ({"router": "tcp://[::1]:5550"}, "neither an IPv4 address nor a host name"),
        ({"router": "tcp://a;b:5550"}, "neither an IPv4 address nor a host name"),
        ({"prefill": "127.0.0.1:5551"}, "is not tcp://HOST:PORT"),
        ({"prefill": "udp://127.0.0.1:5551"}, "transport must be tcp, ipc or inproc"),
        ({"decode": 5552}, "an endpoint or a non-empty list of them"),
        ({"decode": []}, "an endpoint or a non-empty list of them"),
        ({"detok": ["ipc://" + "x" * 200]}, r"detok\[0\].*at most 107 bytes"),
        ({"detok": ["tcp://127.0.0.1:5550"]}, "needs an endpoint of its own"),
    ],
)
def test_malformed_endpoints_are_refused_at_load(changed, message):
    with pytest.raises(ValueError, match=message):
        _with(**changed)


def test_addresses_need_every_receiver():
    with pytest.raises(ValueError, match="missing detok; unknown detoks"):
        config_from_dict({"addresses": {**{k: v for k, v in GOOD.items() if k != "detok"},
                                        "detoks": []}, "security": {"keys_dir": "/k"}})  # fmt: skip


def test_a_receiver_binds_exactly_its_address():
    """tcp://127.0.0.1:PORT used to bind tcp://*:PORT: every interface, the network included."""
    assert bind_address("tcp://127.0.0.1:5755") == "tcp://127.0.0.1:5755"
    assert bind_address("tcp://localhost:5755") == "tcp://127.0.0.1:5755"  # resolved: IPv4
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    try:
        sock.bind(bind_address(f"tcp://127.0.0.1:{port}"))
        assert sock.getsockopt_string(zmq.LAST_ENDPOINT) == f"tcp://127.0.0.1:{port}"
    finally:
        sock.close(linger=0)
        ctx.term()


@pytest.mark.parametrize(
    "router, message",
    [
        ({"header_timeout_s": 0}, "header_timeout_s must be a number of seconds above 0"),
        ({"body_timeout_s": "30"}, "body_timeout_s must be a number of seconds above 0"),
        ({"max_connections": 0}, "max_connections must be a count of at least 1"),
        ({"max_connections_per_peer": True}, "max_connections_per_peer must be a count"),
        ({"max_connections": 10, "max_connections_per_peer": 11}, "cannot exceed max_connections"),
        ({"max_connections": 300, "max_connections_per_peer": 10}, "must exceed max_running"),
    ],
)
def test_connection_limits_are_checked(router, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict({"router": router, "cluster": {"run_dir": "/tmp/x"}})


def test_prefill_threads_auto_is_half_the_cpus_and_a_count_is_kept():
    from splitserve.engine import prefill_threads

    def model(**keys):
        return config_from_dict({"model": keys, "cluster": {"run_dir": "/x"}}).model

    auto = model()
    assert auto.prefill_cpu_threads == "auto" and auto.cpu_threads == 0
    assert [prefill_threads(auto, n) for n in (1, 2, 3, 16)] == [1, 1, 1, 8]
    assert prefill_threads(model(prefill_cpu_threads=0), 2) == 0  # 0: one per CPU
    assert prefill_threads(model(prefill_cpu_threads=3), 2) == 3
    round_trip = config_from_dict(config_to_dict(config_from_dict(
        {"model": {"prefill_cpu_threads": 2}, "cluster": {"run_dir": "/x"}})))  # fmt: skip
    assert round_trip.model.prefill_cpu_threads == 2


@pytest.mark.parametrize("model", [{"prefill_cpu_threads": "half"}, {"prefill_cpu_threads": -1},
                                   {"prefill_cpu_threads": 1.0}, {"cpu_threads": "auto"},
                                   {"cpu_threads": True}])  # fmt: skip
def test_thread_counts_are_checked_at_load(model):
    with pytest.raises(ValueError, match="cpu_threads"):
        config_from_dict({"model": model, "cluster": {"run_dir": "/x"}})


@pytest.mark.parametrize("key", ["stuck_timeout_s", "loop_stuck_timeout_s"])
def test_stuck_bounds_are_zero_or_longer_than_a_heartbeat(key, tmp_path):
    def load(value):
        lifecycle = {"heartbeat_interval_s": 0.25, key: value}
        return config_from_dict({"cluster": {"run_dir": str(tmp_path)}, "lifecycle": lifecycle})

    assert getattr(load(0).lifecycle, key) == 0
    assert getattr(load(5).lifecycle, key) == 5
    for bad in (0.25, -1, "30", True):
        with pytest.raises(ValueError, match=rf"\[lifecycle\] {key} must be 0 \(never\) or more"):
            load(bad)


def test_a_request_s_own_chat_template_is_trusted_only_when_the_operator_says_so(tmp_path):
    import argparse

    from splitserve.cli import add_serve_args, config_from_args

    base = {"cluster": {"run_dir": str(tmp_path)}}
    assert config_from_dict(base).router.trust_request_chat_template is False
    trusted = config_from_dict({**base, "router": {"trust_request_chat_template": True}})
    assert trusted.router.trust_request_chat_template is True
    assert config_from_dict(config_to_dict(trusted)).router.trust_request_chat_template is True
    with pytest.raises(ValueError, match="trust_request_chat_template must be true or false"):
        config_from_dict({**base, "router": {"trust_request_chat_template": "yes"}})
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    for flags, want in (([], False), (["--trust-request-chat-template"], True)):
        args = parser.parse_args(["--engine", "fake", "--tokenizer", "t", *flags])
        router = config_from_args(args, lambda: str(tmp_path)).router
        assert router.trust_request_chat_template is want
