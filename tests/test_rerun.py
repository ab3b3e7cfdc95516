"""Re-running from a stored run: which (regression, case, target) `--from-run` selects."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from repro import rerun
from repro.cli import main
from tests.conftest import repro
from tests.test_reports import CRASH_CASE, FIXTURE, with_regression


@pytest.fixture
def run() -> dict[str, Any]:
    return json.loads((FIXTURE / "run.json").read_text())


def test_last_failed_picks_bad_verdicts_and_missing_results(run: dict[str, Any]) -> None:
    assert rerun.select_from_run(run) == []
    bad = with_regression(run)
    bad["missing_results"] = [{"target": "te-2.20.2", "case_id": "issue22:x-y"}]
    assert rerun.select_from_run(bad) == [("issue22", CRASH_CASE, "te-2.13.0+backport"),
                                          ("issue22", "issue22:x-y", "te-2.20.2")]


def test_by_verdict_and_case(run: dict[str, Any]) -> None:
    picked = rerun.select_from_run(run, ["reproduced"])
    assert len(picked) == 4 and {s.target for s in picked} == {"te-2.13.0"}
    assert rerun.select_from_run(run, ["reproduced", "fixed"], [CRASH_CASE]) == [
        ("issue22", CRASH_CASE, t) for t in ("te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2")]
    assert rerun.select_cases([CRASH_CASE, CRASH_CASE]) == [("issue22", CRASH_CASE, None)]


def test_selection_reads_only_the_stored_verdicts(run: dict[str, Any]) -> None:
    changed = copy.deepcopy(run)
    changed["results"][0]["verdict"] = "other_failure"
    assert rerun.select_from_run(changed) == [("issue22", changed["results"][0]["case_id"], "te-2.13.0")]


@pytest.mark.parametrize("argv, message", [
    (["run", "--verdict", "regression"], "--verdict and --last-failed need --from-run DIR"),
    (["run", "--from-run", str(FIXTURE), "--verdict", "bogus"], "unknown verdict 'bogus' in --verdict; valid:"),
    (["run", "--from-run", str(FIXTURE), "--verdict", "fixed", "--last-failed"], "not both"),
    (["run", "--case", "no spaces allowed"], "bad case id 'no spaces allowed' for --case"),
    (["run", "--from-run", "/nonexistent/run", "--last-failed"], "is neither a run dir nor a run.json"),
    (["run", "--case", CRASH_CASE.replace("-none-", "-megatron-")], "is not a valid case: recompute wrappers run"),
    (["run", "--case", CRASH_CASE.replace("float32", "float64")], "dtype=float64 is not a value of that axis"),
    (["run", "--case", "issue99:" + CRASH_CASE.partition(":")[2]], "unknown regression 'issue99'"),
    (["run", "--case", CRASH_CASE, "--only", "dtype=float32"], "drop --only"),
])
def test_bad_rerun_flags_are_one_line_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_nothing_to_rerun_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--from-run", str(FIXTURE), "--last-failed"]) == 0
    assert "nothing to re-run" in capsys.readouterr().err


def test_rerun_runs_exactly_the_selected_results(tmp_path: Path) -> None:
    """The four stored `reproduced` results run again, on their own target only, and reproduce."""
    result = repro("run", "--from-run", str(FIXTURE), "--verdict", "reproduced", "--out", str(tmp_path), "-n", "1")
    assert result.returncode == 0, result.stderr
    again = json.loads((tmp_path / "run.json").read_text())
    stored = {(r["target"], r["case_id"]) for r in json.loads((FIXTURE / "run.json").read_text())["results"]
              if r["verdict"] == "reproduced"}
    assert {(r["target"], r["case_id"]) for r in again["results"]} == stored
    assert {r["verdict"] for r in again["results"]} == {"reproduced"} and again["matrix"] == "rerun"
