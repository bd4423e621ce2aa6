"""Shared fixtures: small tokenizers made by the tests themselves (nothing from a model hub);
and the run order: modules with slow tests first, so that with `-n` (pytest-xdist, as `make
test` runs) the longest ones start at once instead of last, beside the many short ones."""

from __future__ import annotations

import pytest

from splitserve.tokenizers.synthetic import build_synthetic_tokenizer


@pytest.fixture(scope="session")
def tokenizer_512(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer.json with exactly 512 ids (for the fake engine and test-tiny)."""
    return build_synthetic_tokenizer(str(tmp_path_factory.mktemp("tok512")), 512)


@pytest.fixture(scope="session")
def tokenizer_8000(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer.json with exactly 8,000 ids (the tiny-7m preset's vocabulary)."""
    return build_synthetic_tokenizer(str(tmp_path_factory.mktemp("tok8000")), 8000)


@pytest.fixture(scope="module")
def client(stack):
    """The openai client of the module's `stack` fixture (tests/http_stack.py)."""
    return stack.openai()


@pytest.fixture(scope="module")
def model(client):
    """The name the module's stack serves its model under."""
    return client.models.list().data[0].id


# The longest modules of a run on the 2-core machine (pytest --durations), longest first: with
# -n they start at once, in parallel, instead of after the short ones.
LONGEST = ("test_supervisord_shipped", "test_langchain_agent_smollm2", "test_supervisord",
           "test_migration_jax", "test_two_hosts", "test_api_controls_jax")


def pytest_collection_modifyitems(config, items):
    """The LONGEST modules first, then the other modules holding a test marked slow, then the
    rest; each module's tests together and in order (its module fixtures are set up once)."""
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}

    def rank(item) -> tuple[int, int]:
        name = item.module.__name__
        if name.rpartition(".")[2] in LONGEST:
            return (0, LONGEST.index(name.rpartition(".")[2]))
        return (1 if name in slow else 2, 0)

    items.sort(key=rank)  # stable: the order within each rank is kept
