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


LONG = "path:/home/someone/work/a-vendor-fork-of-transformer-engine@HEAD~1"  # a spec as users write them
VERDICTS = {"reproduced": 120, "fixed": 70, "unaffected": 400, "known_bug": 9, "not_applicable": 31,
            "regression": 3, "other_failure": 2, "harness_error": 7}


def test_off_a_terminal_one_short_line_per_30_s() -> None:
    """A CI log gets one line for the whole run at most every 30 s (done/total, percentage,
    elapsed, ETA, what needs a look), never one per target, and a last one at the end."""
    out, clock = io.StringIO(), FakeClock()
    progress = Progress({LONG: 2416, f"{LONG}+backport": 2416}, tty=False, stream=out, clock=clock)
    assert out.getvalue() == ""  # nothing while the targets are prepared: a refusal there is the only line
    progress.update(LONG, 0, {})
    assert out.getvalue().startswith("starting the target sessions")
    clock.now += 6
    progress.update(LONG, 0, {})
    assert len(out.getvalue().splitlines()) == 1  # nothing before the first result
    progress.update(LONG, 100, {"reproduced": 100})
    for step in range(1, 60):  # an update every 5 s for 295 s: a line every 30 s
        clock.now += 5
        progress.update(LONG, 100 + 10 * step, {**VERDICTS, "reproduced": 100 + 10 * step - 642})
    lines = out.getvalue().splitlines()[1:]
    assert len(lines) == 1 + 295 // 30
    assert lines[0] == "[6s] 100/4832 results (2%), ETA ?, 0 need a look"
    assert lines[1] == "[36s] 160/4832 results (3%), ETA 38m56s, 12 need a look"  # 60 results in 30 s
    assert all(len(line) <= 120 for line in lines)
    clock.now += 1
    progress.update(f"{LONG}+backport", 2416, {"fixed": 2415, "regression": 1})
    progress.close()
    final = out.getvalue().splitlines()[-1]
    assert final == "[5m02s] 3106/4832 results (64%), 13 need a look"  # 302 s; no ETA at the end
    assert len(out.getvalue().splitlines()) == 2 + len(lines)  # the last line, besides the throttled ones


def test_on_a_terminal_at_80_columns_done_total_and_eta_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict counters are cut first; the name, done/total, elapsed and ETA stay."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    out = Terminal()
    progress = Progress({LONG: 2416, "te-2.13.0": 12}, tty=True, stream=out)
    progress.update(LONG, 600, VERDICTS)
    progress.update("te-2.13.0", 12, {"fixed": 4, "unaffected": 8})
    progress.close()
    final = [line.rstrip() for line in ANSI.sub("", out.getvalue()).splitlines() if line.strip()][-2:]
    assert all(len(line) <= 80 for line in final), final
    # what needs a look comes first among the counters, so it is the last to be cut
    assert re.search(r"^….*HEAD~1 ━+ +600/2416 \d:\d\d ETA [-:\d]+ 2 other_failure, 3 r.*…$", final[0]), final
    assert re.search(r"^te-2\.13\.0 +━+ +12/12 +\d:\d\d ETA 0:00 4 fixed, 8 unaffected$", final[1]), final


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
