"""Peers are authenticated: CURVE on tcp, one keypair per process. A receiver takes
messages only from the cluster's processes of a role that sends to it, and names the sender of
each; a sender without keys, with a stranger's key, or of the wrong role delivers nothing; a
sender reaches only the receiver whose public key it has. Safe by default: tcp beyond loopback
without keys is refused when the file is loaded. Keys: 0600 secrets, made once per process."""

from __future__ import annotations

import contextlib
import os
import stat
import time

import pytest
import zmq

from splitserve import protocol
from splitserve.config import config_from_dict, load_config
from splitserve.launch.ports import free_port
from splitserve.protocol import Abort, TransportCounters
from splitserve.security import (
    CurveClient,
    Keyring,
    curve_client,
    curve_server,
    generate_keys,
    process_name,
)
from splitserve.transport import Receiver, Sender

NAMES = ["router", "prefill-0", "decode-0", "detok-0", "detok-1"]


@pytest.fixture
def keys(tmp_path) -> str:
    keys_dir = str(tmp_path / "keys")
    generate_keys(keys_dir, NAMES)
    return keys_dir


@contextlib.contextmanager
def receiver_of(keys: str, role: str, index: int = 0):
    """A CURVE receiver of process (role, index) on a loopback port, in a context of its own."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    receiver = Receiver(ctx, endpoint, TransportCounters(),
                        curve=curve_server(keys, endpoint, role, index))  # fmt: skip
    try:
        yield receiver, endpoint
    finally:
        receiver.close()
        ctx.destroy(linger=0)


@contextlib.contextmanager
def sender_to(endpoint: str, curve=None, socket_options=None):
    """A sender in a context of its own: another process, as far as ZeroMQ is concerned."""
    ctx = zmq.Context()
    sender = Sender(ctx, endpoint, TransportCounters(), curve)
    for option, value in (socket_options or {}).items():
        sender.socket.setsockopt(option, value)
    try:
        yield sender
    finally:
        sender.close()
        ctx.destroy(linger=0)


def delivered(receiver: Receiver, sender: Sender, wait_s: float) -> list:
    """What reaches the receiver of a message sent every 50 ms for wait_s."""
    got = []
    deadline = time.monotonic() + wait_s
    i = 0
    while time.monotonic() < deadline and not got:
        with contextlib.suppress(zmq.Again):
            sender.socket.send_multipart(sender_frames(i), zmq.NOBLOCK)
        i += 1
        if receiver.poll(50):
            got = receiver.drain_from()
    return got


def sender_frames(i: int) -> list:
    return protocol.encode(Abort([f"r{i}"], [0]))


def test_the_right_sender_delivers_and_is_named(keys):
    with receiver_of(keys, "decode") as (receiver, endpoint):
        curve = curve_client(keys, endpoint, ("router", 0), ("decode", 0))
        with sender_to(endpoint, curve) as sender:
            got = delivered(receiver, sender, 20)
    assert got and got[0][2] == "router"  # the ZAP user id: the process its key names


def test_a_sender_without_keys_delivers_nothing(keys):
    with receiver_of(keys, "router") as (receiver, endpoint), sender_to(endpoint) as sender:
        assert delivered(receiver, sender, 2) == []


def test_a_stranger_s_key_delivers_nothing(keys):
    public, secret = zmq.curve_keypair()
    with receiver_of(keys, "router") as (receiver, endpoint):
        server = Keyring(keys).public("router")
        with sender_to(endpoint, CurveClient(public, secret, server)) as sender:
            assert delivered(receiver, sender, 2) == []
        assert receiver.zap.refused >= 1


def test_a_process_of_a_role_that_does_not_send_there_is_refused(keys):
    """Only the router sends to a prefill worker: decode's own key does not get it in."""
    with receiver_of(keys, "prefill") as (receiver, endpoint):
        curve = curve_client(keys, endpoint, ("decode", 0), ("prefill", 0))
        with sender_to(endpoint, curve) as sender:
            assert delivered(receiver, sender, 2) == []
        assert receiver.zap.refused >= 1


def test_a_sender_reaches_only_the_receiver_whose_key_it_has(keys):
    """An impostor bound where the router should be, with another keypair, gets nothing from a
    genuine worker: the handshake checks the server's key too."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    impostor = ctx.socket(zmq.PULL)
    impostor.curve_server = True
    impostor.curve_publickey, impostor.curve_secretkey = zmq.curve_keypair()
    impostor.bind(endpoint)
    try:
        curve = curve_client(keys, endpoint, ("detok", 0), ("router", 0))
        with sender_to(endpoint, curve) as sender:
            for i in range(20):
                with contextlib.suppress(zmq.Again):
                    sender.socket.send_multipart(sender_frames(i), zmq.NOBLOCK)
                time.sleep(0.05)
            assert impostor.poll(500) == 0
    finally:
        impostor.close(linger=0)
        ctx.destroy(linger=0)


def test_keys_are_one_pair_per_process_secrets_0600_and_kept_when_made_again(keys):
    for name in NAMES:
        secret = os.stat(os.path.join(keys, f"{name}.key_secret")).st_mode
        public = os.stat(os.path.join(keys, f"{name}.key")).st_mode
        assert stat.S_IMODE(secret) == 0o600 and stat.S_IMODE(public) == 0o644
    before = Keyring(keys).keypair("decode-0")
    assert generate_keys(keys, [*NAMES, "detok-2"]) == ["detok-2"]  # only the new one
    assert Keyring(keys).keypair("decode-0") == before
    names = Keyring(keys).names_by_key()
    assert sorted(names.values()) == sorted([*NAMES, "detok-2"])
    assert len(set(names)) == len(names)  # every process its own key


def test_a_secret_key_others_can_read_is_refused(keys):
    os.chmod(os.path.join(keys, "decode-0.key_secret"), 0o644)
    with pytest.raises(ValueError, match="readable by others"):
        Keyring(keys).keypair("decode-0")


def test_process_names():
    assert process_name("router", 0) == "router" and process_name("detok", 3) == "detok-3"


# ---- the cluster file ---------------------------------------------------------------------------

LAN = {"router": "tcp://10.0.0.1:5550", "prefill": "tcp://10.0.0.1:5551",
       "decode": "tcp://10.0.0.2:5552", "detok": ["tcp://10.0.0.2:5560"]}  # fmt: skip
LOOPBACK = {"router": "tcp://127.0.0.1:5550", "prefill": "tcp://127.0.0.1:5551",
            "decode": "tcp://localhost:5552", "detok": ["ipc:///tmp/x/d0.sock"]}  # fmt: skip


def test_tcp_beyond_loopback_without_keys_is_refused_at_load():
    with pytest.raises(ValueError, match=r"10\.0\.0\.1:5550 is reachable from the network.*keys"):
        config_from_dict({"addresses": LAN})


@pytest.mark.parametrize("host", ["decode-host.example", "0.0.0.0"])
def test_a_host_name_or_the_any_address_counts_as_the_network(host):
    with pytest.raises(ValueError, match="reachable from the network"):
        config_from_dict({"addresses": {**LOOPBACK, "decode": f"tcp://{host}:5552"}})


def test_loopback_and_ipc_need_no_keys_and_keys_make_the_network_fine():
    assert config_from_dict({"addresses": LOOPBACK}).security.keys_dir == ""
    config = config_from_dict({"addresses": LAN, "security": {"keys_dir": "/etc/k"}})
    assert config.security.keys_dir == "/etc/k"


def test_keys_are_for_processes_mode():
    with pytest.raises(ValueError, match="threads mode"):
        config_from_dict({"cluster": {"mode": "threads", "run_dir": "/tmp/x"},
                          "security": {"keys_dir": "/etc/k"}})  # fmt: skip


def test_a_relative_keys_dir_is_relative_to_the_cluster_file(tmp_path):
    conf = tmp_path / "cluster.toml"
    conf.write_text('[security]\nkeys_dir = "keys"\n[cluster]\nrun_dir = "/tmp/x"\n')
    assert load_config(str(conf)).security.keys_dir == str(tmp_path / "keys")
