"""The suite's ceiling child (lab/suite/ceiling_process.py): `splitserve bench --ceiling --probe`
kept up between the suite's loads; a child that cannot measure is an error that says why, never a
hang."""

import pytest

from lab.suite.ceiling_process import CeilingProcess, CeilingProcessError


def test_ceiling_process_reports_a_child_that_cannot_measure(tmp_path):
    args = ["--engine", "fake", "--slots", "2", "--context", "64", "--max-seq-len", "32"]
    with open(tmp_path / "ceiling.log", "wb") as log, CeilingProcess(args, log) as child:
        with pytest.raises(CeilingProcessError, match="ended|exited"):
            child.measure(timeout_s=60)
    assert "must fit" in (tmp_path / "ceiling.log").read_text()
