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


def _with_fractions(suite, fractions: dict[int, float]):
    """The committed tiny record, its processes loads given these fractions of the ceiling."""
    tiny = _section(suite, "tiny")
    for run in tiny.reports["processes"]["runs"]:
        run["fraction_of_ceiling"] = fractions[run["concurrency"]]
    return tiny


def test_throughput_target_is_the_mean_of_the_saturated_loads_not_the_best():
    suite = _suite()
    # c=16 equals the slot count: waves wait on their prefills there, so it is not saturation
    below = _with_fractions(suite, {1: 0.06, 16: 0.99, 64: 0.85, 128: 0.93})
    row = suite._throughput_row(below)
    assert row[1].startswith("89.0%, the mean over the loads above 16 streams"), row[1]
    assert "c=64 85.0%" in row[1] and "c=128 93.0%" in row[1] and "c=16 " not in row[1]
    # each load shows the terms of served = batch fill x slots / step gap
    assert row[1].count("step gap mean") == 2 and row[1].count("batch fill") == 2
    assert row[2] == "no"
    above = _with_fractions(suite, {1: 0.06, 16: 0.5, 64: 0.88, 128: 0.93})
    assert suite._throughput_row(above)[2] == "yes"
