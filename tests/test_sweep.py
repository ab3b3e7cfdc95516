"""The release sweep names each regression's first affected and first fixed release."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.runner import sweep
from harness.runner.sweep import first_affected, first_fixed, not_monotonic, releases_in_range
from repro.cli import main
from tests.conftest import repro


def _rows(*states: str) -> list[dict]:
    return [{"release": f"2.{i}.0", "state": s} for i, s in enumerate(states)]


def test_first_fixed_rule() -> None:
    assert first_fixed(_rows("fixed", "affected", "affected", "fixed", "fixed")) == "2.3.0"
    assert first_fixed(_rows("affected", "not loadable", "fixed")) == "2.2.0"
    assert first_fixed(_rows("affected", "fixed", "affected")) is None  # broken again later
    assert first_fixed(_rows("fixed", "fixed")) is None  # never affected in the range
    assert first_fixed(_rows("affected", "not loadable")) is None  # an unloadable release is never fixed


def test_first_affected_and_not_monotonic() -> None:
    assert first_affected(_rows("fixed", "affected", "fixed")) == "2.1.0"
    assert first_affected(_rows("affected", "fixed")) == "before 2.0.0"
    assert first_affected(_rows("not loadable", "affected", "fixed")) == "before 2.1.0"
    assert first_affected(_rows("fixed", "fixed")) is None
    # a fix backported to one release and missing from the next is shown as it is
    assert not_monotonic(_rows("affected", "fixed", "affected", "fixed")) == ["2.2.0"]
    assert not_monotonic(_rows("fixed", "affected", "affected", "fixed")) == []  # passes before the bug came in
    assert first_fixed(_rows("affected", "fixed", "affected", "fixed")) == "2.3.0"


def test_range_selection() -> None:
    available = ["2.20.2", "2.16.0", "2.15.0", "2.9.0", "1.13.0", "0.0.0"]
    assert releases_in_range(available, "2.9.0", "2.16.0") == ["2.9.0", "2.15.0", "2.16.0"]
    assert releases_in_range(available, "2.16.0", "latest") == ["2.16.0", "2.20.2"]
    with pytest.raises(UsageError, match="no transformer-engine release"):
        releases_in_range(available, "3.0.0", None)


def test_sweep_names_2_16_0(tmp_path: Path) -> None:
    result = repro("sweep", "--matrix", "issue22", "--from", "2.15.0", "--to", "2.16.1", "--out", str(tmp_path),
                   check_rc=0)
    assert "first fixed release: 2.16.0 (declared: 2.16.0)" in result.stdout
    assert "first affected release: before 2.15.0" in result.stdout
    row = next(line.split() for line in result.stdout.splitlines() if line.startswith("2.15.0"))
    assert row[1:6] == ["4", "4", "0", "0", "0"]  # affected, reproduced, failed otherwise, passed, others


def test_sweep_missing_results_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep whose sessions lost results names its releases from what it has, and fails."""
    lost = {"target": "te-2.16.0", "case_id": "issue22:x", "reason": "its session exited with status 1"}
    partial = {"rows": [], "first_affected": None, "first_fixed": None, "not_monotonic": [],
               "run": {"results": [], "complete": False, "missing": 1, "not_run": [lost]}}
    monkeypatch.setattr(sweep, "sweep", lambda *args, **kwargs: partial)
    assert main(["sweep", "--matrix", "issue22", "--out", str(tmp_path / "sweep"), "--offline"]) == 1
    assert "INCOMPLETE run: 1 case results missing (te-2.16.0: 1)" in capsys.readouterr().err
