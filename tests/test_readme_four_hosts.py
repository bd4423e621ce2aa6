"""The README's 2P2D example is deploy/four-hosts.toml: the same cluster (parsed, so comments may
differ), and the launch commands it gives name every host of the file, each once."""

from __future__ import annotations

import os
import re
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example() -> str:
    with open(os.path.join(ROOT, "README.md")) as fh:
        text = fh.read()
    start = text.index("### Example: two prefill hosts, two decode hosts (2P2D)")
    return text[start:text.index("\n## ", start)]


def test_the_readme_example_is_the_shipped_file():
    block = re.search(r"```toml\n(.*?)```", _example(), re.S).group(1)
    with open(os.path.join(ROOT, "deploy", "four-hosts.toml"), "rb") as fh:
        assert tomllib.loads(block) == tomllib.load(fh)


def test_the_readme_launches_every_host_of_the_file_once():
    with open(os.path.join(ROOT, "deploy", "four-hosts.toml"), "rb") as fh:
        hosts = sorted(tomllib.load(fh)["hosts"])
    launched = re.findall(r"^deploy/launch\.sh (\S+) deploy/four-hosts\.toml", _example(), re.M)
    assert sorted(launched) == hosts
