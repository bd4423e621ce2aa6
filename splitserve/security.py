"""Who may talk to whom: ZeroMQ CURVE on tcp endpoints, one keypair per process.

The key scheme. Every process of the cluster (`router`, `prefill-<i>`, `decode-<i>`,
`detok-<i>`) has a keypair of its own in [security] keys_dir: `<name>.key` (public) and
`<name>.key_secret` (secret, 0600), made by `splitserve keys generate DIR --config FILE`.
- A receiver (the PULL socket a process binds) is a CURVE server with its own keypair; each of
  its senders is a CURVE client with its own keypair and the receiver's public key, so a sender
  also knows it reaches the real receiver (a process with another key cannot pose as it).
- The receiver's ZAP handler (ZapHandler) accepts a client only if its public key is one of the
  cluster's and the process it names is of a role that sends to this role (SENDERS_TO); the
  name becomes the connection's ZAP user id, which ZeroMQ stamps on every message
  (Frame.get("User-Id")): the router then checks that a Heartbeat of decode[1] comes from
  decode-1, and a worker that a GenerateRequest comes from the router (MESSAGE_SENDERS).
Why one pair per process rather than one for the cluster or one per role: a cluster key would let
any process that holds it pose as every other; per role, a prefill host could still pose as the
other prefill hosts. Per process, each host holds only its own secrets (the public keys go
everywhere), and what one compromised host can forge is its own processes' messages.

ipc endpoints keep the file permissions as their boundary (0600 sockets in a 0700 run_dir: only
this user reaches them, who could as well ptrace the workers); inproc never leaves the process.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass

import zmq
from zmq.utils import z85

from splitserve import protocol
from splitserve.secret_files import write_secret_file

log = logging.getLogger(__name__)

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
_NAME = re.compile(r"^(router|(prefill|decode|detok)-(\d+))$")
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
# a client key the keyring does not know sends the handler back to the directory, at most this
# often (a detok worker added while serving brings a new key; a flood of strangers must not
# turn every handshake into a directory scan)
RESCAN_INTERVAL_S = 1.0
REFUSAL_LOG_S = 10.0  # a misconfigured peer retries ten times a second: one line, with a count

# the roles whose processes send to each role's receiver
SENDERS_TO = {
    "router": frozenset({"prefill", "decode", "detok"}),
    "prefill": frozenset({"router"}),
    "decode": frozenset({"router", "prefill", "detok"}),
    "detok": frozenset({"router", "prefill", "decode"}),
}


# which roles send each message type (docs/protocol.md's table)
MESSAGE_SENDERS: dict[type, frozenset[str]] = {
    protocol.GenerateRequest: frozenset({"router"}),
    protocol.PrefixHeader: frozenset({"prefill"}),
    protocol.TokenBatch: frozenset({"prefill", "decode"}),
    protocol.TextBatch: frozenset({"detok"}),
    protocol.Abort: frozenset({"router"}),
    protocol.Fence: frozenset({"router"}),
    protocol.Finish: frozenset({"detok"}),
    protocol.RequestFailed: frozenset({"prefill", "decode", "detok"}),
    protocol.Ready: frozenset({"prefill", "decode", "detok"}),
    protocol.Heartbeat: frozenset({"prefill", "decode", "detok"}),
    protocol.ResumeStream: frozenset({"router"}),
    protocol.Repin: frozenset({"router"}),
    protocol.DetokPool: frozenset({"router"}),
    protocol.RouterHello: frozenset({"router"}),
}
_TOKEN_SOURCES = {protocol.Source.PREFILL: "prefill", protocol.Source.DECODE: "decode"}


def sent_by(msg: object, peer: str) -> bool:
    """The authenticated process `peer` may have sent msg: its role sends this type (a
    TokenBatch: of the source it names)."""
    sender = parse_process_name(peer)
    if sender is None or sender[0] not in MESSAGE_SENDERS.get(type(msg), ()):
        return False
    if isinstance(msg, protocol.TokenBatch):
        return _TOKEN_SOURCES[msg.source] == sender[0]
    return True


def process_name(role: str, index: int) -> str:
    """The name of a process's keypair and of its ZAP identity."""
    return "router" if role == "router" else f"{role}-{index}"


def parse_process_name(name: str) -> tuple[str, int] | None:
    """(role, index) of a process name, None if it is not one."""
    m = _NAME.match(name)
    if m is None:
        return None
    return ("router", 0) if m.group(1) == "router" else (m.group(2), int(m.group(3)))


# ---- keys on disk -------------------------------------------------------------------------------


def _certificate(public: bytes, secret: bytes | None) -> str:
    """ZeroMQ's certificate format (zmq.auth.load_certificate reads it)."""
    lines = ["# splitserve CURVE key (ZeroMQ certificate format)", "metadata", "curve",
             f'    public-key = "{public.decode()}"']  # fmt: skip
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def generate_keys(keys_dir: str, names: list[str]) -> list[str]:
    """A keypair for each name that has none in keys_dir yet (existing keys are kept, so adding
    a worker to the file and generating again adds its key); returns the names made."""
    os.makedirs(keys_dir, mode=0o755, exist_ok=True)
    made = []
    for name in names:
        if parse_process_name(name) is None:
            raise ValueError(f"{name!r} names no process (router, prefill-N, decode-N, detok-N)")
        secret_path = os.path.join(keys_dir, name + SECRET_SUFFIX)
        if os.path.exists(secret_path):
            continue
        public, secret = zmq.curve_keypair()
        write_secret_file(secret_path, _certificate(public, secret))
        with open(os.path.join(keys_dir, name + PUBLIC_SUFFIX), "w") as fh:
            fh.write(_certificate(public, None))
        made.append(name)
    return made


def _read_key(path: str, field: str) -> bytes:
    with open(path) as fh:
        for line in fh:
            key, sep, value = line.strip().partition("=")
            if sep and key.strip() == field:
                return value.strip().strip('"').encode()
    raise ValueError(f"{path} holds no {field}")


@dataclass(frozen=True)
class Keyring:
    """The keys of [security] keys_dir, read when a socket is made (each process reads its own
    secret and its peers' public keys)."""

    keys_dir: str

    def public(self, name: str) -> bytes:
        path = os.path.join(self.keys_dir, name + PUBLIC_SUFFIX)
        if not os.path.exists(path):
            raise ValueError(f"no public key for {name} in {self.keys_dir}: run "
                             "`splitserve keys generate DIR --config FILE`")  # fmt: skip
        return _read_key(path, "public-key")

    def keypair(self, name: str) -> tuple[bytes, bytes]:
        """(public, secret) of this process; ValueError if missing or readable by others."""
        path = os.path.join(self.keys_dir, name + SECRET_SUFFIX)
        if not os.path.exists(path):
            raise ValueError(f"no secret key for {name} in {self.keys_dir}: copy it to this host "
                             "or run `splitserve keys generate`")  # fmt: skip
        if os.stat(path).st_mode & 0o077:
            raise ValueError(f"{path} is readable by others: chmod 600 it")
        return _read_key(path, "public-key"), _read_key(path, "secret-key")

    def names_by_key(self) -> dict[bytes, str]:
        """Every process's public key (32 raw bytes, as ZAP gives them) -> its name."""
        out = {}
        for entry in os.listdir(self.keys_dir):
            name = entry.removesuffix(PUBLIC_SUFFIX)
            if entry.endswith(PUBLIC_SUFFIX) and parse_process_name(name) is not None:
                out[z85.decode(self.public(name))] = name
        return out


# ---- what a socket needs ---------------------------------------------------------------------


@dataclass(frozen=True)
class CurveServer:
    """A receiver's CURVE settings: its keypair, and its keyring for the ZAP handler."""

    name: str  # the receiving process (also its ZAP domain)
    public: bytes
    secret: bytes
    keyring: Keyring

    def apply(self, socket: zmq.Socket) -> None:
        socket.curve_server = True
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
        socket.zap_domain = self.name.encode()


@dataclass(frozen=True)
class CurveClient:
    """A sender's CURVE settings: its own keypair and the receiver's public key."""

    public: bytes
    secret: bytes
    server_public: bytes

    def apply(self, socket: zmq.Socket) -> None:
        socket.curve_serverkey = self.server_public
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret


def uses_curve(keys_dir: str, endpoint: str) -> bool:
    """CURVE on tcp endpoints when the cluster has keys; ipc and inproc as they are."""
    return bool(keys_dir) and endpoint.startswith("tcp://")


def curve_server(keys_dir: str, endpoint: str, role: str, index: int) -> CurveServer | None:
    if not uses_curve(keys_dir, endpoint):
        return None
    keyring = Keyring(keys_dir)
    name = process_name(role, index)
    public, secret = keyring.keypair(name)
    return CurveServer(name, public, secret, keyring)


def curve_client(
    keys_dir: str, endpoint: str, own: tuple[str, int], peer: tuple[str, int]
) -> CurveClient | None:
    """The settings for a sender of process `own` to the receiver of process `peer`."""
    if not uses_curve(keys_dir, endpoint):
        return None
    keyring = Keyring(keys_dir)
    public, secret = keyring.keypair(process_name(*own))
    return CurveClient(public, secret, keyring.public(process_name(*peer)))


# ---- the ZAP handler -------------------------------------------------------------------------


class ZapHandler:
    """ZeroMQ's authentication hook for the CURVE receivers of one context, on a thread of its
    own: a client is let in when its key is the cluster's and its process's role sends to the
    receiver's role; its process name is the connection's user id."""

    def __init__(self, ctx: zmq.Context, keyring: Keyring):
        self.keyring = keyring
        self.names = keyring.names_by_key()
        self._scanned = time.monotonic()
        self.refused = 0
        self._logged_at = -float("inf")  # refusals are logged at most every REFUSAL_LOG_S
        self.socket = ctx.socket(zmq.REP)
        self.socket.linger = 0
        try:
            self.socket.bind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            self.socket.close()
            raise ValueError("one CURVE receiver per zmq context: this one has a ZAP handler "
                             "already") from None  # fmt: skip
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="zap", daemon=True)
        self.thread.start()

    def authorize(self, domain: str, client_key: bytes) -> str | None:
        """The client's process name if it may send to the receiver named `domain`."""
        name = self.names.get(client_key)
        if name is None and time.monotonic() - self._scanned >= RESCAN_INTERVAL_S:
            self.names = self.keyring.names_by_key()
            self._scanned = time.monotonic()
            name = self.names.get(client_key)
        receiver = parse_process_name(domain)
        sender = parse_process_name(name) if name else None
        if sender is None or receiver is None or sender[0] not in SENDERS_TO[receiver[0]]:
            return None
        return name

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(100):
                    continue
                self._reply(self.socket.recv_multipart())
        except zmq.ZMQError as exc:  # the context ended under us (a process exiting)
            log.debug("ZAP handler ends: %s", exc)
        finally:
            self.socket.close(linger=0)

    def _reply(self, frames: list[bytes]) -> None:
        # ZAP request: version, request id, domain, address, identity, mechanism, credentials
        version, request_id = frames[0], frames[1] if len(frames) > 1 else b""
        user = None
        if len(frames) == 7 and version == b"1.0" and frames[5] == b"CURVE":
            user = self.authorize(frames[2].decode(errors="replace"), frames[6])
        if user is None:
            self.refused += 1
            now = time.monotonic()
            if now - self._logged_at >= REFUSAL_LOG_S:
                self._logged_at = now
                address = frames[3].decode(errors="replace") if len(frames) > 3 else "?"
                log.warning("refused a connection from %s (%d refused in all): not the key of a "
                            "process that sends here", address, self.refused)  # fmt: skip
            self.socket.send_multipart([b"1.0", request_id, b"400", b"not allowed", b"", b""])
        else:
            self.socket.send_multipart([b"1.0", request_id, b"200", b"OK", user.encode(), b""])

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
