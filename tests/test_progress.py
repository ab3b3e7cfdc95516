"""What `repro run` prints: live lines on a terminal, throttled lines off one, the status line."""

from __future__ import annotations

import copy
import io
import json
import re
from typing import Any

import pytest

from repro.progress import Progress, print_status_line, status_line
from tests.test_reports import FIXTURE, with_regression

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeClock:
    """Time that moves only when the test says so (no timed test)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def run() -> dict[str, Any]:
    return json.loads((FIXTURE / "run.json").read_text())


def test_off_a_terminal_one_line_per_interval() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = Progress({"te-2.13.0": 10, "te-2.16.0": 10}, tty=False, stream=out, interval_s=5, clock=clock)
    assert out.getvalue() == ""  # nothing while the targets are prepared: a refusal there is the only line
    progress.update("te-2.13.0", 0, {})
    assert out.getvalue().startswith("starting the target sessions")
    clock.now += 6
    progress.update("te-2.13.0", 0, {})
    assert len(out.getvalue().splitlines()) == 1  # nothing before the first result
    progress.update("te-2.13.0", 3, {"reproduced": 2, "unaffected": 1})
    for _ in range(20):  # many updates within one interval: no new line
        clock.now += 0.1
        progress.update("te-2.16.0", 1, {"fixed": 1})
    lines = out.getvalue().splitlines()
    assert lines[1:] == ["[6s] te-2.13.0 3/10 (2 reproduced, 1 unaffected); te-2.16.0 0/10 (no result yet)"]
    clock.now += 5
    progress.update("te-2.16.0", 10, {"fixed": 4, "regression": 1})
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[-1] == "[13s] te-2.13.0 3/10 (2 reproduced, 1 unaffected); te-2.16.0 10/10 (4 fixed, 1 regression)"


def test_on_a_terminal_one_live_line_per_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = Terminal()
    progress = Progress({"te-2.13.0": 12, "te-2.13.0+backport": 12}, tty=True, stream=out)
    progress.update("te-2.13.0", 6, {"reproduced": 2, "unaffected": 4})
    progress.update("te-2.13.0+backport", 12, {"fixed": 4, "unaffected": 8})
    progress.close()
    text = ANSI.sub("", out.getvalue())
    final = [line for line in text.splitlines() if line.strip()][-2:]  # rich redraws in place: the last frame
    assert re.search(r"te-2\.13\.0 .* 6/12 .*ETA.* 2 reproduced, 4 unaffected", final[0]), final
    assert re.search(r"te-2\.13\.0\+backport .*12/12 .* 4 fixed, 8 unaffected", final[1]), final
    assert "\x1b[" in out.getvalue()


def test_status_line_says_pass_headline_counts_elapsed_and_paths(run: dict[str, Any]) -> None:
    paths = {"report.md": "runs/x/report.md", "report.html": "runs/x/report.html"}
    line = status_line(run, paths)
    assert line == ("PASS | issue22: backport fixes 4 of 4 affected cases; backport matches upstream te-2.16.0 on all"
                    " 12 cases | 0 need a look; 4 reproduced, 12 fixed, 32 unaffected | 41s"
                    " | reports: runs/x/report.md, runs/x/report.html")
    assert "\n" not in line
    failing = status_line(with_regression(run))
    assert failing.startswith("FAIL | ") and "1 need a look (1 regression)" in failing
    incomplete = copy.deepcopy(run)
    incomplete.update(complete=False, missing=2)
    assert status_line(incomplete).startswith("FAIL") and "incomplete: 2 results missing" in status_line(incomplete)


def test_status_line_colour_and_no_color(run: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = Terminal()
    print_status_line(with_regression(run), stream=out)
    assert "\x1b[" in out.getvalue() and "FAIL" in out.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    plain = Terminal()
    print_status_line(with_regression(run), stream=plain)
    assert "\x1b[" not in plain.getvalue()
    assert plain.getvalue().startswith(" FAIL  issue22: backport fixes")
    piped = io.StringIO()  # not a terminal: no colour either
    monkeypatch.delenv("NO_COLOR")
    print_status_line(run, stream=piped)
    assert "\x1b[" not in piped.getvalue() and piped.getvalue().startswith(" PASS  issue22:")
