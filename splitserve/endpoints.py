"""ZeroMQ endpoints as the cluster file names them: checked when the file is loaded, and bound
exactly as written.

An endpoint is where a receiver binds and where its senders connect, so it must be an address
both can use: `tcp://HOST:PORT` with an IPv4 address or a host name and a port (1-65535),
`ipc://PATH`, or `inproc://NAME`. Binding exactly that address (not every interface) keeps a
receiver configured on loopback off the network. A host name is resolved (IPv4) where the
receiver binds: ZeroMQ binds addresses and interface names, not names from DNS.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

# sun_path holds 108 bytes with its terminating NUL
MAX_IPC_PATH_BYTES = 107
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class Endpoint:
    transport: str  # tcp | ipc | inproc
    address: str  # the host (tcp), the path (ipc) or the name (inproc)
    port: int = 0  # tcp only


def parse_endpoint(endpoint: object, where: str = "endpoint") -> Endpoint:
    """The endpoint, or ValueError saying what is wrong with it (`where` names it)."""
    if not isinstance(endpoint, str):
        raise ValueError(f"{where}: an endpoint is a string, not {endpoint!r}")
    transport, sep, rest = endpoint.partition("://")
    if not sep or not rest:
        raise ValueError(f"{where}: {endpoint!r} is not tcp://HOST:PORT, ipc://PATH or inproc://NAME")
    if transport == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not port.isdigit() or not 1 <= int(port) <= 65535 or port[0] == "0":
            raise ValueError(f"{where}: {endpoint!r} needs a port from 1 to 65535 (tcp://HOST:PORT)")
        if not _valid_host(host):
            raise ValueError(
                f"{where}: {endpoint!r}: {host!r} is neither an IPv4 address nor a host name"
            )
        return Endpoint("tcp", host, int(port))
    if transport == "ipc":
        if len(rest.encode()) > MAX_IPC_PATH_BYTES or "\0" in rest:
            raise ValueError(
                f"{where}: {endpoint!r}: an ipc path has at most {MAX_IPC_PATH_BYTES} bytes"
            )
        return Endpoint("ipc", rest)
    if transport == "inproc":
        return Endpoint("inproc", rest)
    raise ValueError(f"{where}: {endpoint!r}: the transport must be tcp, ipc or inproc")


def bind_address(endpoint: str) -> str:
    """What a receiver binds: exactly the endpoint, a host name resolved to its IPv4 address."""
    parsed = parse_endpoint(endpoint)
    if parsed.transport != "tcp" or _is_ipv4(parsed.address):
        return endpoint
    try:
        infos = socket.getaddrinfo(parsed.address, parsed.port, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        message = f"cannot bind {endpoint!r}: {parsed.address!r} does not resolve: {exc}"
        raise ValueError(message) from None
    return f"tcp://{infos[0][4][0]}:{parsed.port}"


def is_loopback(host: str) -> bool:
    """An address only this machine reaches: 127.0.0.0/8, or the name localhost. Other names are
    not resolved here: what a name resolves to can change, so it counts as the network."""
    if host == "localhost":
        return True
    return _is_ipv4(host) and ipaddress.IPv4Address(host).is_loopback


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _valid_host(host: str) -> bool:
    if _is_ipv4(host):
        return True
    if not host or len(host) > 253 or (host[0].isdigit() and host.replace(".", "").isdigit()):
        return False  # empty, too long, or digits that are no IPv4 address ("1.2.3.456")
    return all(_HOST_LABEL.match(label) for label in host.removesuffix(".").split("."))
