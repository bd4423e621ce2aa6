"""The Debian archive this machine's apt uses, for `make image-test`'s debootstrap: the first
source that serves SUITE, read as apt-get reads its sources (/etc/apt/sources.list, then
sources.list.d/*.list and *.sources in name order; one-line and deb822 entries). So the
repository names no mirror: the machine's own setting decides, as it does for apt-get.

    python3 deploy/debian_mirror.py bookworm      # prints the archive's URI, e.g. for debootstrap
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterator


def apt_source_files(root: str = "/etc/apt") -> list[str]:
    """The files apt reads, in its order."""
    listed = sorted(glob.glob(os.path.join(root, "sources.list.d", "*.list"))
                    + glob.glob(os.path.join(root, "sources.list.d", "*.sources")))  # fmt: skip
    main = os.path.join(root, "sources.list")
    return ([main] if os.path.exists(main) else []) + listed


def one_line_entries(text: str) -> Iterator[tuple[str, str]]:
    """(uri, suite) of each `deb [options] uri suite [components...]` line."""
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields or fields[0] != "deb":
            continue
        fields = fields[1:]
        if fields and fields[0].startswith("["):  # options, up to the field closing them
            while fields and not fields.pop(0).endswith("]"):
                pass
        if len(fields) >= 2:
            yield fields[0], fields[1]


def deb822_entries(text: str) -> Iterator[tuple[str, str]]:
    """(uri, suite) of each enabled `Types: deb` stanza, every URI with every suite."""
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:  # a continuation line
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                yield uri, suite


def mirror(suite: str, root: str = "/etc/apt") -> str | None:
    """The first source's URI that serves `suite`, or None."""
    for path in apt_source_files(root):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        entries = deb822_entries(text) if path.endswith(".sources") else one_line_entries(text)
        for uri, served in entries:
            if served == suite:
                return uri.rstrip("/")
    return None


def main(argv: list[str]) -> int:
    suite = argv[0] if argv else "bookworm"
    uri = mirror(suite)
    if uri is None:
        print(f"no apt source of this machine serves {suite!r} (/etc/apt/sources.list, "
              "sources.list.d): name one there, as apt-get needs it", file=sys.stderr)  # fmt: skip
        return 1
    print(uri)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
