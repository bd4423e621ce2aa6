"""The suite's targets table renders from the records a suite run writes (lab/results/suite/*.json):
one row per target, a verdict in each, and the detok-heavy load's two modes beside the table; and
the document the suite writes from those records is the committed lab/suite.md."""

import json
import pathlib
import re

from lab.suite.document import section_doc
from lab.suite.results import SectionResult
from lab.suite.sections import Section
from lab.suite.targets import targets, throughput_row

REPO = pathlib.Path(__file__).resolve().parents[2]


def _section(key):
    record = json.loads((REPO / "lab" / "results" / "suite" / f"{key}.json").read_text())
    return SectionResult(
        Section(**record["section"]),
        ceiling=record["ceiling"],
        mode_ceilings=record.get("mode_ceilings", {}),
        reports=record["reports"],
        errors=record.get("errors", []),
    )


def test_targets_table_has_a_verdict_for_every_target():
    text = targets({"tiny": _section("tiny"), "detok": _section("detok")})
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == "| target | measured | met |"
    verdicts = [re.search(r"\| (yes|no) \|$", row) for row in rows[1:]]
    assert len(rows) == 6 and all(verdicts), text  # throughput, step gap, 64 and 128, TTFT
    assert "served prefill mean" in rows[-1] and "batch fill" in rows[1]
    assert "Beside the targets, the detok-heavy load at 128 streams" in text


def test_targets_without_their_sections_say_so():
    assert "No target applies" in targets({})
    assert "No target applies" in targets({"fake": _section("fake")})


def _with_fractions(fractions: dict[int, float]):
    """The committed tiny record, its processes loads given these fractions of the ceiling."""
    tiny = _section("tiny")
    for run in tiny.reports["processes"]["runs"]:
        run["fraction_of_ceiling"] = fractions[run["concurrency"]]
    return tiny


def test_throughput_target_is_the_mean_of_the_saturated_loads_not_the_best():
    # c=16 equals the slot count: waves wait on their prefills there, so it is not saturation
    below = _with_fractions({1: 0.06, 16: 0.99, 64: 0.85, 128: 0.93})
    row = throughput_row(below)
    assert row[1].startswith("89.0%, the mean over the loads above 16 streams"), row[1]
    assert "c=64 85.0%" in row[1] and "c=128 93.0%" in row[1] and "c=16 " not in row[1]
    # each load shows the terms of served = batch fill x slots / step gap
    assert row[1].count("step gap mean") == 2 and row[1].count("batch fill") == 2
    assert row[2] == "no"
    above = _with_fractions({1: 0.06, 16: 0.5, 64: 0.88, 128: 0.93})
    assert throughput_row(above)[2] == "yes"


def test_the_committed_document_is_what_the_suite_writes_from_its_records(tmp_path):
    """Its targets and every section's text, line for line (not the plots' files, nor the
    seconds a section took, which the records do not keep)."""
    doc = (REPO / "lab" / "suite.md").read_text()
    records = {key: _section(key) for key in ("tiny", "detok", "fake", "smollm2")}
    assert targets(records) in doc
    for res in records.values():
        text = section_doc(res, str(tmp_path), str(tmp_path))
        lines = [line for line in text.splitlines()
                 if line and not line.startswith("![") and " s for this section" not in line]
        assert len(lines) > 5 and [line for line in lines if line not in doc] == []
