"""The suite's targets table renders from the records a suite run writes (docs/bench/*.json):
one row per target, a verdict in each, and the detok-heavy load's two modes beside the table."""

import importlib.util
import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


def _suite():
    """bench/run_suite.py is a script, not a package module: load it by path, once."""
    if "run_suite" not in sys.modules:
        spec = importlib.util.spec_from_file_location("run_suite", REPO / "bench" / "run_suite.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["run_suite"] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["run_suite"]


def _section(suite, key):
    record = json.loads((REPO / "docs" / "bench" / f"{key}.json").read_text())
    return suite.SectionResult(
        suite.Section(**record["section"]),
        ceiling=record["ceiling"],
        mode_ceilings=record.get("mode_ceilings", {}),
        reports=record["reports"],
    )


def test_targets_table_has_a_verdict_for_every_target():
    suite = _suite()
    text = suite.targets({"tiny": _section(suite, "tiny"), "detok": _section(suite, "detok")})
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == "| target | measured | met |"
    verdicts = [re.search(r"\| (yes|no) \|$", row) for row in rows[1:]]
    assert len(rows) == 6 and all(verdicts), text  # throughput, step gap, 64 and 128, TTFT
    assert "served prefill mean" in rows[-1] and "batch fill" in rows[1]
    assert "Beside the targets, the detok-heavy load at 128 streams" in text


def test_targets_without_their_sections_say_so():
    suite = _suite()
    assert "No target applies" in suite.targets({})
    assert "No target applies" in suite.targets({"fake": _section(suite, "fake")})
