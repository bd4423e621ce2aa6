"""Files that hold a secret (the API key, CURVE secret keys): written readable by their owner
alone (0600) from the first byte, and read back stripped of surrounding whitespace."""

from __future__ import annotations

import os

PRIVATE_FILE_MODE = 0o600


def write_secret_file(path: str, text: str) -> str:
    """Write text to path with mode 0600 (an existing file is truncated and made 0600 first, so
    the secret never sits in a file others can read)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return path


def read_secret_file(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()
