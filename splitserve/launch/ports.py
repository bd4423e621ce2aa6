"""A free TCP port on loopback, for a local stack's router (benchmarks and tests run several)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS's pick); the caller binds it soon after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
