"""The release sweep finds the release that fixed issue 22."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.runner.sweep import first_fixed, releases_in_range
from tests.conftest import repro


def _rows(*verdicts: str) -> list[dict]:
    return [{"release": f"2.{i}.0", "verdict": v} for i, v in enumerate(verdicts)]


def test_first_fixed_rule() -> None:
    assert first_fixed(_rows("fixed", "affected", "affected", "fixed", "fixed")) == "2.3.0"
    assert first_fixed(_rows("affected", "not loadable", "fixed")) == "2.2.0"
    assert first_fixed(_rows("affected", "fixed", "affected")) is None  # broken again later
    assert first_fixed(_rows("fixed", "fixed")) is None  # never affected in the range
    assert first_fixed(_rows("affected", "not loadable")) is None  # an unloadable release is never fixed


def test_range_selection() -> None:
    available = ["2.20.2", "2.16.0", "2.15.0", "2.9.0", "1.13.0", "0.0.0"]
    assert releases_in_range(available, "2.9.0", "2.16.0") == ["2.9.0", "2.15.0", "2.16.0"]
    assert releases_in_range(available, "2.16.0", "latest") == ["2.16.0", "2.20.2"]
    with pytest.raises(UsageError, match="no transformer-engine release"):
        releases_in_range(available, "3.0.0", None)


def test_sweep_names_2_16_0(tmp_path: Path) -> None:
    result = repro("sweep", "--matrix", "smoke", "--from", "2.15.0", "--to", "2.16.1", "--out", str(tmp_path),
                   check_rc=0)
    assert "first release in which every affected case passes: 2.16.0" in result.stdout
    assert "2.15.0     4/4" in result.stdout
