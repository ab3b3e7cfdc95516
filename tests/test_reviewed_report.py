"""reports/issue-22.md is what the issue22 matrix gives today: CI regenerates the
verdict report from a fresh run and compares it byte for byte."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, repro

REVIEWED = REPO / "reports" / "issue-22.md"
REFRESH = ("repro run --matrix issue22 --out runs/issue22 && "
           "repro report runs/issue22 --format verdict-md -o reports/issue-22.md   (or: nox -s report)")


@pytest.mark.slow
def test_reviewed_report_is_current(tmp_path: Path) -> None:
    run = repro("run", "--matrix", "issue22", "--out", str(tmp_path / "run"))
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 1: the run found something; the diff shows it
    fresh = tmp_path / "issue-22.md"
    repro("report", str(tmp_path / "run"), "--format", "verdict-md", "-o", str(fresh), check_rc=0)
    expected, actual = REVIEWED.read_text(), fresh.read_text()
    # The pull-request form of the same run stays short enough to read in a review.
    pr_report = (tmp_path / "run" / "report.md").read_text()
    folded = re.sub(r"<details>.*?</details>", "<details/>", pr_report, flags=re.DOTALL)
    assert len(folded.splitlines()) < 60, folded
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            "reports/issue-22.md (committed)", "regenerated", n=1))
        pytest.fail(f"reports/issue-22.md no longer matches a fresh issue22 run.\n{diff[:6000]}\n"
                    f"If the change is intended, refresh the reviewed report and commit it:\n  {REFRESH}",
                    pytrace=False)
