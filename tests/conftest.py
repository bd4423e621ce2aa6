"""Shared fixtures: small tokenizers made by the tests themselves (nothing from a model hub);
and the run order: modules with slow tests first, so that with `-n` (pytest-xdist, as `make
test` runs, with --dist loadfile --no-loadscope-reorder) the longest ones start at once instead
of last, beside the many short ones; and the modules that compile the default model all on one
worker, one after another, so that its cold compiles (minutes each in CI, whose store starts
empty) never run two at a time beside the rest of the suite."""

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


@pytest.fixture(params=["avx512", "avx2", "portable"])
def isa(request):
    """Each instruction-set path of the native kernels this CPU has (the others skip), put
    back to the best afterwards."""
    from splitserve.engine.kernels import qkernel

    got = qkernel.set_isa(request.param)
    if got != request.param:
        pytest.skip(f"this CPU lacks {request.param}")
    yield got
    qkernel.set_isa("avx512")


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
LONGEST = ("test_supervisord_shipped", "test_langchain_agent_smollm2", "test_engine_smollm2",
           "test_supervisord", "test_migration_jax", "test_two_hosts", "test_api_controls_jax")


# The modules that compile the default model (SmolLM2-135M) in a stack or an engine.
DEFAULT_MODEL = ("test_supervisord_shipped", "test_langchain_agent_smollm2", "test_engine_smollm2")


def _module_name(nodeid: str) -> str:
    return nodeid.split("::")[0].rpartition("/")[2].removesuffix(".py")


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, but the DEFAULT_MODEL modules are one unit of work (one worker runs
    them in turn). Other --dist modes are xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class DefaultModelTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if _module_name(nodeid) in DEFAULT_MODEL:
                return "the default model's modules"
            return super()._split_scope(nodeid)

    return DefaultModelTogether(config, log)


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
